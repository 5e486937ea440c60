"""Drives a hermes sandbox through `hermes mcp` with the official MCP
Python SDK (`pip install mcp`): what an agent does with the tools.

    python3 drive.py [--task NAME]

It writes a small program, runs it, starts a server in the background,
asks it something, reads its log and stops it. Every command runs in the
task's sandbox of the configured backend (`terminal.backend`).
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def text(result) -> str:
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def main() -> None:
    task = sys.argv[sys.argv.index("--task") + 1] if "--task" in sys.argv else "mcp-demo"
    server = StdioServerParameters(command="hermes", args=["mcp", "--task", task])
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            print("tools:", ", ".join(t.name for t in tools.tools))

            async def tool(name, **args):
                result = await session.call_tool(name, args)
                body = text(result)
                if getattr(result, "is_error", getattr(result, "isError", False)):
                    raise RuntimeError(f"{name}: {body}")
                return json.loads(body)

            await tool("terminal", command="mkdir -p /workspace/demo && cd /workspace/demo")
            await tool(
                "write_file",
                path="hello.py",
                content="import sys\nprint('hello from', sys.platform)\n",
            )
            ran = await tool("terminal", command="python3 hello.py")
            print(f"exit {ran['exit_code']} in {ran['cwd']}: {ran['output'].strip()}")

            started = await tool(
                "terminal",
                command="python3 -m http.server 8000 > server.log 2>&1",
                background=True,
            )
            pid = started["process_id"]
            asked = await tool(
                "terminal",
                command="sleep 1; python3 -c \"import urllib.request as u; "
                "print(u.urlopen('http://127.0.0.1:8000/hello.py').status)\"",
            )
            print("the server answered", asked["output"].strip())
            log = await tool("read_file", path="server.log")
            print(log["content"], end="")
            print("poll:", (await tool("process", action="poll", process_id=pid))["state"])
            print("kill:", (await tool("process", action="kill", process_id=pid))["state"])


asyncio.run(main())
