"""examples/mini_swe_agent.py: mini-swe-agent's own agent loop in a workspace sandbox, scored by the swe verifier.
The model is a scripted OpenAI-compatible server (the replies a model would give); skipped without
mini-swe-agent (``pip install --no-deps mini-swe-agent``) or where the sandbox cannot run."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentgym.envs.workspace.sandbox import workspace_problem
from agentgym.envs.workspace.suites.swe import SweSuite

pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed: pip install --no-deps mini-swe-agent")
if workspace_problem():
    pytest.skip(f"the workspace sandbox cannot run here: {workspace_problem()}", allow_module_level=True)

from examples import mini_swe_agent  # noqa: E402


def _scripted_server(replies: list[str]):
    seen: list[list[dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body["messages"])
            text = replies[min(len(seen), len(replies)) - 1]
            answer = {
                "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            }  # fmt: skip
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def _block(command: str) -> str:
    return f"THOUGHT: next.\n\n```mswea_bash_command\n{command}\n```"


SUBMIT = _block("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")


@pytest.mark.parametrize("fix", [True, False])
def test_mini_swe_agent_in_the_sandbox_earns_the_verifier_reward(fix):
    seed = 4
    task = SweSuite()(seed)
    _, edit, _ = task.expert
    args = edit["arguments"]
    patch = (
        f"python3 -c 'import json,pathlib; p=pathlib.Path({json.dumps(args['path'])}); "
        f'p.write_text(p.read_text().replace(*json.load(open("/tmp/edit.json"))))\''
    )
    write_edit = f"cat > /tmp/edit.json <<'EOF'\n{json.dumps([args['old_str'], args['new_str']])}\nEOF"
    replies = [_block("python3 -m unittest"), "no block here", _block(write_edit), _block(patch)]
    server, seen = _scripted_server((replies if fix else replies[:2]) + [SUBMIT])
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        reward = mini_swe_agent.run(url, "key", {"extra_info": {"seed": seed}}, model="m")
    finally:
        server.shutdown()
    assert reward == (1.0 if fix else 0.0)
    assert seen[0][1]["content"].startswith("Please solve this issue: " + task.instruction)  # mini-swe-agent's template
    assert "FAILED" in seen[1][-1]["content"] and "<returncode>1</returncode>" in seen[1][-1]["content"]
    assert "Format error" in seen[2][-1]["content"] or "EXACTLY ONE" in seen[2][-1]["content"].upper()


def test_task_rows_carry_the_seed_and_instruction():
    rows = mini_swe_agent.task_rows(3, start=10, modules=1)
    assert [r["extra_info"]["seed"] for r in rows] == [10, 11, 12]
    assert rows[0]["prompt"][0]["content"] == SweSuite(modules=1)(10).instruction
