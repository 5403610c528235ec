"""The tests' plugin module (ROLLPACKER_PLUGINS=my_plugin): policy foo, rollout engine counting, trainer loud."""
import sys

from attrs import field, frozen

from rollpacker.core.errors import ConfigError
from rollpacker.core.policies import SyncPolicy, register_policy
from rollpacker.train.registry import ROLLOUTS, options_of, register_rollout, register_trainer
from rollpacker.train.trainers import TorchTrainerOptions, common_options


@frozen(kw_only=True)
class FooPolicy(SyncPolicy):
    """The plugin's policy."""

    name = "foo"
    foo_knob: int = 3
    """A knob only the plugin has."""

    def open_round(self, state):
        print(f"foo opens a round, foo_knob={self.foo_knob}", file=sys.stderr, flush=True)
        return super().open_round(state)


def _label(instance, attribute, value):
    if not value:
        raise ConfigError("--counting.label must not be empty")


class CountingEngine:
    """The embedded engine, counting the requests it is given."""

    def __init__(self, inner, label):
        self.inner, self.label, self.submitted = inner, label, 0

    def submit(self, requests):
        self.submitted += len(requests)
        self.inner.submit(requests)

    def close(self):
        print(f"counting engine {self.label}: {self.submitted} requests", flush=True)
        self.inner.close()

    def __getattr__(self, name):
        return getattr(self.inner, name)


@frozen(kw_only=True)
class CountingRollout:
    """The embedded engine, counted."""

    label: str = field(default="plain", validator=_label)
    """Printed beside the count when the engine closes."""

    def build(self, context):
        return CountingEngine(options_of(ROLLOUTS, "embedded", context.run).build(context), self.label)


@frozen(kw_only=True)
class LoudTrainerOptions(TorchTrainerOptions):
    """Plain PyTorch, saying so at each optimizer step."""

    flat = False
    tag: str = "t"
    """Printed at each optimizer step."""

    def build(self, context):
        from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig

        tag = self.tag

        class LoudTrainer(TorchTrainer):
            def optimizer_step(self, loss_normalizer):
                print(f"loud trainer {tag}: optimizer step", flush=True)
                return super().optimizer_step(loss_normalizer)

        return LoudTrainer(TorchTrainerConfig(**common_options(context)))


register_policy("foo", FooPolicy)
register_rollout("counting", CountingRollout)
register_trainer("loud", LoudTrainerOptions)
