"""The sibling texts a simulated request's drafter copies from, and the finished share the measured
acceptance is read at (`speculation.SpecConstants.accepted_per_step`).

The share of a running request of prompt p:

    share = min(1, texts / siblings)
    texts    = p's requests that finished (complete responses) this round
               + with `carry` (`spec.carry_drafts`): p's requests that finished in earlier rounds
                 since p was drawn (the short round that deferred it; a carried group's earlier
                 rounds), forgotten once p is trained
    siblings = max(p's requests launched this round, R) - 1

At the headline (R = 8, a long round relaunching all 8 samples of each deferred prompt) `siblings`
is 7, the share the measurement is by (spec_acceptance.json: a group of 8, the share of the other 7
finished); a short round that over-launches R' > R responses counts R' - 1.  Conservative where the
measurement is silent: aborted partial texts never count (the table measured finished siblings
only), though the embedded engine drafts from them too; the share is capped at 1 (more complete
texts than siblings read as the measured "all finished", never extrapolated).  An assumption: a text
generated under an older policy (before the weight updates since the round that deferred the
prompt) drafts as well as this round's; the embedded engine verifies every draft under the current
weights, so only the acceptance, never the output, depends on it.
"""

from __future__ import annotations

from collections.abc import Iterable

from attrs import define, field

from rollpacker.core.records import PromptKey


@define
class _Group:
    launched: int = 0
    finished: int = 0
    live: set[str] = field(factory=set)


class SiblingTexts:
    """The round's groups (prompt -> requests launched, finished, live) and, with `carry`, each
    pending prompt's complete texts from earlier rounds."""

    def __init__(self, samples: int, carry: bool) -> None:
        self.samples = samples
        self.carry = carry
        self.groups: dict[PromptKey, _Group] = {}
        self.prompt_of: dict[str, PromptKey] = {}
        self.earlier: dict[PromptKey, int] = {}
        """Complete texts of a prompt from earlier rounds since it was drawn (only with `carry`)."""

    def launched(self, rid: str, prompt: PromptKey) -> None:
        group = self.groups.setdefault(prompt, _Group())
        group.launched += 1
        group.live.add(rid)
        self.prompt_of[rid] = prompt

    def ended(self, rid: str, finished: bool) -> set[str]:
        """The request ended (finished, or aborted with a partial text); its live siblings."""
        group = self.groups.get(self.prompt_of.pop(rid, None))
        if group is None:
            return set()
        group.finished += finished
        group.live.discard(rid)
        return group.live

    def share(self, rid: str) -> float:
        """The finished share of a live request's siblings (the module docstring); 0 if unknown."""
        prompt = self.prompt_of.get(rid)
        group = self.groups.get(prompt)
        if group is None:
            return 0.0
        texts = group.finished + self.earlier.get(prompt, 0)
        return min(1.0, texts / max(max(group.launched, self.samples) - 1, 1))

    def end_round(self, trained: Iterable[PromptKey]) -> None:
        """A new round's groups; with `carry`, this round's complete texts are kept for the prompts
        not trained (they run again), and a trained prompt's are forgotten."""
        if self.carry:
            for prompt, group in self.groups.items():
                if group.finished:
                    self.earlier[prompt] = self.earlier.get(prompt, 0) + group.finished
            for prompt in trained:
                self.earlier.pop(prompt, None)
        self.groups = {}
        self.prompt_of = {}
