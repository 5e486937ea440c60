"""Drives `hermes mcp` with the official MCP Python SDK: over stdio, or
over streamable HTTP with a bearer token.

argv[1]: the path of a JSON spec {"command": ..., "args": [...], "steps": [...]}
(stdio: the server is spawned), or {"url": ..., "token": ..., "steps": [...]}
(HTTP: the session is ended with a DELETE when the client closes); each
step is {"op": "list"} or {"op": "call", "tool": ..., "args": {...},
"progress": bool}. Prints one JSON list: per step, the tools, or the call's
text, isError, progress notifications (with their arrival times) and when
the result arrived; or the protocol error.
"""

import asyncio
import contextlib
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


@contextlib.asynccontextmanager
async def transport(spec):
    """The (read, write) streams to the server the spec names."""
    if "url" not in spec:
        params = StdioServerParameters(
            command=spec["command"], args=spec["args"], env=dict(os.environ)
        )
        async with stdio_client(params) as (read, write):
            yield read, write
        return
    headers = {"Authorization": f"Bearer {spec['token']}"}
    try:  # the SDK from 2.0: an HTTP client of the caller's
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client
    except ImportError:  # the SDK before 2.0
        from mcp.client.streamable_http import streamablehttp_client

        async with streamablehttp_client(spec["url"], headers=headers) as streams:
            yield streams[0], streams[1]
        return
    async with create_mcp_http_client(headers=headers) as client:
        async with streamable_http_client(spec["url"], http_client=client) as streams:
            yield streams[0], streams[1]


async def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    results = []
    async with transport(spec) as (read, write):
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
