// Drives `hermes mcp` over stdio with the official MCP TypeScript SDK.
// The same spec and output as mcp_client.py (argv[2]: the spec's path).

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { McpError } from "@modelcontextprotocol/sdk/types.js";
import { readFileSync } from "node:fs";

const spec = JSON.parse(readFileSync(process.argv[2], "utf8"));
const transport = new StdioClientTransport({
  command: spec.command,
  args: spec.args,
  env: { ...process.env },
  stderr: "inherit",
});
const client = new Client({ name: "hermes-test", version: "1.0.0" });
await client.connect(transport);
const now = () => performance.now() / 1000;
const results = [];
for (const step of spec.steps) {
  const result = {};
  try {
    if (step.op === "list") {
      const tools = await client.listTools();
      result.tools = tools.tools.map((t) => ({
        name: t.name,
        description: t.description,
        schema: t.inputSchema,
      }));
    } else {
      const progress = [];
      const options = { timeout: 120000 };
      if (step.progress) {
        options.onprogress = (p) =>
          progress.push({ at: now(), progress: p.progress, message: p.message ?? null });
      }
      result.started_at = now();
      const out = await client.callTool(
        { name: step.tool, arguments: step.args ?? {} },
        undefined,
        options,
      );
      result.ended_at = now();
      result.is_error = Boolean(out.isError);
      result.text = (out.content ?? [])
        .filter((c) => c.type === "text")
        .map((c) => c.text)
        .join("");
      result.progress = progress;
    }
  } catch (e) {
    if (e instanceof McpError) {
      result.protocol_error = { code: e.code, message: e.message };
    } else {
      throw e;
    }
  }
  results.push(result);
}
await client.close();
console.log(JSON.stringify(results));
