"""The weight endpoints of `rollpacker serve` (`server.EngineServer`): /update_weights_from_disk, the
distributed path (/init_weights_update_group, /begin_weight_update, /update_weights_from_distributed,
/end_weight_update, /destroy_weights_update_group), with SGLang 0.5.23's shapes and refusals.  A
weight update blocks, so it runs in the loop's default executor; the group's broadcasts are in
`weights`."""

from __future__ import annotations

import asyncio

try:  # optional (the `serve` extra)
    from aiohttp import web
except ImportError:  # pragma: no cover
    web = None


def error_reply(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def failed_reply(message: str) -> web.Response:
    """SGLang's answer to a weight call that failed: 400 with success false."""
    return web.json_response({"success": False, "message": message}, status=400)


class WeightEndpoints:
    """The weight handlers of `EngineServer`: they use its `engine`, `_waiters` (requests running),
    `_groups` (joined weight groups), `_update_session`, `weight_version` and `model_path`."""

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            path = body["model_path"]
            if not isinstance(path, str) or not path:
                raise KeyError("model_path")
        except (ValueError, KeyError, TypeError):
            return error_reply("update_weights_from_disk needs a JSON body with model_path")
        label = body.get("weight_version")
        try:
            version = int(label) if label is not None else int(self.weight_version) + 1
        except ValueError:
            return error_reply(f"weight_version must be an integer label here, got {label!r}")
        if body.get("abort_all_requests") and self._waiters:
            self.engine.abort(list(self._waiters))
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.engine.update_weights, path, version)
        except Exception as exc:  # noqa: BLE001  (reported to the caller, as SGLang does)
            return web.json_response(
                {"success": False, "message": f"Failed to update weights: {exc}", "num_paused_requests": 0},
                status=400,
            )
        self.weight_version = str(version)
        self.model_path = path
        return web.json_response({
            "success": True,
            "message": f"Succeeded to update model weights. Weight version updated to {version}.",
            "num_paused_requests": 0,
        })

    async def init_weights_update_group(self, request: web.Request) -> web.Response:
        """Join the trainer's weight group as rank `rank_offset` (TP size 1 here); blocks until every
        member has joined, as SGLang's does."""
        try:
            body = await request.json()
            address, port = body["master_address"], int(body["master_port"])
            rank, world_size = int(body["rank_offset"]), int(body["world_size"])
            group_name, backend = body.get("group_name", "weight_update_group"), body.get("backend", "nccl")
        except (ValueError, KeyError, TypeError, AttributeError):
            return error_reply("init_weights_update_group needs a JSON body with master_address, master_port, "
                          "rank_offset, world_size (and group_name, backend)")
        if backend == "nccl" and self._device_type() != "cuda":
            return failed_reply(f"backend 'nccl' needs the engine on CUDA; it is on {self._device_type()} (use gloo)")
        if group_name in self._groups:
            return failed_reply(f"group {group_name!r} is already joined")
        from rollpacker.backends.sglang.weights import join_group

        try:
            self._groups[group_name] = await asyncio.get_running_loop().run_in_executor(
                None, join_group, address, port, rank, world_size, group_name, backend, 600.0)
        except Exception as exc:  # noqa: BLE001  (reported to the caller, as SGLang does)
            return failed_reply(f"Failed to init group: {exc}")
        return web.json_response({"success": True, "message": "Succeeded to initialize custom process group."})

    async def begin_weight_update(self, request: web.Request) -> web.Response:
        if self._update_session:
            return failed_reply("a weight-update session is already open; call end_weight_update() first")
        self._update_session = True
        return web.json_response({"success": True, "message": "Success"})

    async def end_weight_update(self, request: web.Request) -> web.Response:
        if not self._update_session:
            return failed_reply("no weight-update session is open; call begin_weight_update() first")
        self._update_session = False
        return web.json_response({"success": True, "message": "Success"})

    async def destroy_weights_update_group(self, request: web.Request) -> web.Response:
        """Leave the weight group `group_name` (SGLang's answer when there is none: success false)."""
        try:
            group_name = (await request.json()).get("group_name", "weight_update_group")
        except (ValueError, AttributeError):
            return error_reply("destroy_weights_update_group needs a JSON body with group_name")
        group = self._groups.pop(group_name, None)
        if group is None:
            return failed_reply("The group to be destroyed does not exist.")
        import torch.distributed as dist

        await asyncio.get_running_loop().run_in_executor(None, dist.destroy_process_group, group)
        return web.json_response({"success": True, "message": "Succeeded to destroy custom process group."})

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        """Receive one bucket from rank 0 of `group_name` (names, dtypes, shapes in broadcast order)
        and load it into the engine's model (a partial update)."""
        try:
            body = await request.json()
            names, dtypes, shapes = list(body["names"]), list(body["dtypes"]), [list(s) for s in body["shapes"]]
            group = self._groups[body.get("group_name", "weight_update_group")]
            if not len(names) == len(dtypes) == len(shapes):
                raise ValueError("names, dtypes and shapes differ in length")
            version = self._version_label(body.get("weight_version"), default=int(self.weight_version))
            if body.get("load_format") is not None:
                raise ValueError(f"load_format {body['load_format']!r} is not supported (only null)")
        except KeyError as exc:
            return error_reply(f"update_weights_from_distributed: {exc} is missing or not a joined group")
        except (ValueError, TypeError, AttributeError) as exc:
            return error_reply(f"update_weights_from_distributed: {exc}")
        if not self._update_session:
            return failed_reply("update_weights_from_distributed must run between begin_weight_update() and "
                           "end_weight_update()")
        from rollpacker.backends.sglang.weights import receive_bucket

        if body.get("abort_all_requests") and self._waiters:
            self.engine.abort(list(self._waiters))
        loop = asyncio.get_running_loop()
        try:
            received = await loop.run_in_executor(None, receive_bucket, group, names, dtypes, shapes,
                                                  self._device_type())
            await loop.run_in_executor(None, self.engine.update_weights, received, version)
        except Exception as exc:  # noqa: BLE001
            return failed_reply(f"Failed to update weights: {exc}")
        self.weight_version = str(version)
        return web.json_response({"success": True, "message": "Succeeded to update parameter online."})

    def _device_type(self) -> str:
        """Where the engine's model lives ("cpu" for an engine without one)."""
        model = getattr(self.engine, "model", None)
        return next(model.parameters()).device.type if model is not None else "cpu"

    @staticmethod
    def _version_label(label, default: int) -> int:
        try:
            return int(label) if label is not None else default
        except ValueError:
            raise ValueError(f"weight_version must be an integer label here, got {label!r}") from None
