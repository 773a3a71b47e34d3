"""Online acceptance: a serving engine's own speculative-decoding numbers (`vllm`), and the
verdict that sets them beside the offline walk's (`verdict`). Stdlib only: it runs on the
host whose loopback the server listens on, and the controller imports it as it imports
`remote.eval.metrics`."""
