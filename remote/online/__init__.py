"""Online acceptance: a serving engine's own speculative-decoding numbers (`vllm`,
`sglang`), the verdict that sets them beside the offline walk's (`verdict`, its JSON types
`verdict_doc`), and the ``online`` job kind that puts them together on a host (`job`: what
it serves with, `spec`; vLLM's server on loopback, `server`). Stdlib only but `job`: they
run on the host whose loopback the server listens on, and the controller imports `spec`,
`verdict` and `verdict_doc` as it imports `remote.eval.metrics`."""
