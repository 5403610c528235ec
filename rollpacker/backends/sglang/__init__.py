"""SGLang: `client.SGLangEngine` (the rollout-engine Protocol over servers' native HTTP API), `pool`
(its servers, their liveness and the loop thread), `inflight` (its streamed requests), `http` (one
server's API with retries), `codec` (requests and responses; the errors are
`rollpacker.backends.errors`'), `launch` (starting servers), `weights` (weight sync), `server`
(`rollpacker serve`: an SGLang-compatible server over the embedded engine)."""
