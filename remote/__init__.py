"""Code that runs ON a host (trainer or eval host).

Only the standard library, torch, transformers and safetensors may be imported here, and
torch/transformers only inside the commands that need them, so `facts` runs on a host
without torch. This package never imports `orchestrator`: it is shipped to hosts as one
zipapp (see `orchestrator.transport.bundle`) and run with the host's own python.
"""

__version__ = "0.1.0"
