"""The loopback OpenSSH server the tests start (`orchestrator.demo.sshd`, shared with the
benchmarks), under the names the tests import."""

from orchestrator.demo.sshd import SSHD as SSHD
from orchestrator.demo.sshd import SSHServer as SSHServer
from orchestrator.demo.sshd import account_home as account_home
from orchestrator.demo.sshd import clear_stale_pyenv_lock as clear_stale_pyenv_lock
from orchestrator.demo.sshd import free_port as free_port
from orchestrator.demo.sshd import keygen as keygen
from orchestrator.demo.sshd import ssh_host_entry as ssh_host_entry
from orchestrator.demo.sshd import start_sshd as start_sshd
