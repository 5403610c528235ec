"""SGLang: `client.SGLangEngine` (the rollout-engine Protocol over servers' native HTTP API), `http`
(one server's API with retries), `codec` (requests, responses and SGLang's errors), `launch`
(starting servers), `weights` (weight sync), `server` (`rollpacker serve`: an SGLang-compatible
server over the embedded engine)."""
