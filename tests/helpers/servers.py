"""The scripted HTTP servers the tests answer with (`orchestrator.demo.servers`, shared
with the benchmarks), under the names the tests import."""

from orchestrator.demo.servers import BatchedReply as BatchedReply
from orchestrator.demo.servers import Raw as Raw
from orchestrator.demo.servers import Reply as Reply
from orchestrator.demo.servers import ScriptedServer as ScriptedServer
from orchestrator.demo.servers import as_json as as_json
from orchestrator.demo.servers import ids_reply as ids_reply
from orchestrator.demo.servers import redirect as redirect
