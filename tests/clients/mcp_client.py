"""Drives `hermes mcp` over stdio with the official MCP Python SDK.

argv[1]: the path of a JSON spec {"command": ..., "args": [...], "steps": [...]}; each
step is {"op": "list"} or {"op": "call", "tool": ..., "args": {...},
"progress": bool}. Prints one JSON list: per step, the tools, or the call's
text, isError, progress notifications (with their arrival times) and when
the result arrived; or the protocol error.
"""

import asyncio
import json
import os
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
try:
    from mcp.shared.exceptions import MCPError as ProtocolError
except ImportError:  # the SDK before 2.0
    from mcp.shared.exceptions import McpError as ProtocolError


def field(obj, *names):
    """A field by its name in this SDK's version (snake or camel case)."""
    for name in names:
        if hasattr(obj, name):
            return getattr(obj, name)
    return None


async def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    params = StdioServerParameters(
        command=spec["command"], args=spec["args"], env=dict(os.environ)
    )
    results = []
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for step in spec["steps"]:
                result = {}
                try:
                    if step["op"] == "list":
                        tools = await session.list_tools()
                        result["tools"] = [
                            {
                                "name": t.name,
                                "description": t.description,
                                "schema": field(t, "input_schema", "inputSchema"),
                            }
                            for t in tools.tools
                        ]
                    else:
                        progress = []

                        async def on_progress(value, total, message, progress=progress):
                            progress.append(
                                {"at": time.monotonic(), "progress": value, "message": message}
                            )

                        started = time.monotonic()
                        out = await session.call_tool(
                            step["tool"],
                            step.get("args", {}),
                            progress_callback=on_progress if step.get("progress") else None,
                        )
                        result["started_at"] = started
                        result["ended_at"] = time.monotonic()
                        result["is_error"] = bool(field(out, "is_error", "isError"))
                        result["text"] = "".join(
                            c.text for c in out.content if getattr(c, "type", "") == "text"
                        )
                        result["progress"] = progress
                except ProtocolError as e:
                    result["protocol_error"] = {"code": e.error.code, "message": e.error.message}
                results.append(result)
    print(json.dumps(results))


asyncio.run(main())
