"""Tiny real models and local stand-ins, for the embedded demo, the tests and the benchmarks
(and imported only by them).

`models` builds and saves tiny random-weight targets (a Qwen3 text model and a Qwen3.5-style
vision-language model, each with a real tokenizer; `architectures`: the catalogue of real
architectures); `train` trains a tiny DFlash drafter on a target's own greedy outputs;
`oracle` is the reference online speculative-decoding loop. Local stand-ins for real
parts: `gtserver` (a ground-truth server), `servers` (scripted HTTP servers), `sshd`
(loopback OpenSSH), `vllm` and `slurm` (the real ones, on loopback). torch/transformers
are imported lazily: importing this package stays cheap on a controller without torch.
"""
