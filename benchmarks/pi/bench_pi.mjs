// Times Pi's agentLoop (@earendil-works/pi-agent-core 0.85.0) on the workloads of
// ../bench_agent_loop.py, offline, with a scripted model stream. Prints one JSON line
// per workload, which `python benchmarks/bench_agent_loop.py --pi FILE` reads:
//
//   npm ci && node bench_pi.mjs > pi.jsonl        # --quick: 20 warm-up + 100 runs each
//
// The scripted model pushes one step's events in one microtask, as Pi's own tests do:
// start, then per text block text_start / text_delta x N / text_end, per tool call
// toolcall_start / toolcall_delta / toolcall_end, then done. Tools run sequentially.
// Each figure is the median of the timed runs, after an untimed run whose outcome is
// checked and the warm-up runs, as in bench_agent_loop.py.
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { agentLoop } from "@earendil-works/pi-agent-core";
import { createAssistantMessageEventStream, Type } from "@earendil-works/pi-ai";

const QUICK = process.argv.includes("--quick");
const version = (name) =>
	JSON.parse(readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url), "utf8")).version;

const MODEL = {
	id: "scripted",
	name: "scripted",
	api: "scripted",
	provider: "scripted",
	baseUrl: "http://127.0.0.1:0",
	reasoning: false,
	input: ["text"],
	cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
	contextWindow: 1_000_000,
	maxTokens: 65_536,
};
const USAGE = {
	input: 0,
	output: 0,
	cacheRead: 0,
	cacheWrite: 0,
	totalTokens: 0,
	cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 },
};
const assistant = (content, stopReason) => ({
	role: "assistant",
	content,
	api: MODEL.api,
	provider: MODEL.provider,
	model: MODEL.id,
	usage: USAGE,
	stopReason,
	timestamp: 0,
});
const user = (text) => ({ role: "user", content: [{ type: "text", text }], timestamp: 0 });

const echo = {
	name: "echo",
	label: "Echo",
	description: "Returns its text.",
	parameters: Type.Object({ text: Type.String() }),
	async execute(_id, params) {
		return { content: [{ type: "text", text: params.text }], details: params };
	},
};

// A step: { text: [chunks] } for a text answer, or { calls: [{id, name, arguments}] }.
function scriptedStream(steps) {
	let next = 0;
	return () => {
		const step = steps[next++];
		const stream = createAssistantMessageEventStream();
		queueMicrotask(() => {
			const partial = assistant([], step.text ? "stop" : "toolUse");
			stream.push({ type: "start", partial });
			if (step.text) {
				const block = { type: "text", text: "" };
				partial.content.push(block);
				stream.push({ type: "text_start", contentIndex: 0, partial });
				for (const delta of step.text) {
					block.text += delta;
					stream.push({ type: "text_delta", contentIndex: 0, delta, partial });
				}
				stream.push({ type: "text_end", contentIndex: 0, content: block.text, partial });
			} else {
				for (const [contentIndex, call] of step.calls.entries()) {
					const toolCall = { type: "toolCall", ...call };
					partial.content.push(toolCall);
					stream.push({ type: "toolcall_start", contentIndex, partial });
					const delta = JSON.stringify(call.arguments);
					stream.push({ type: "toolcall_delta", contentIndex, delta, partial });
					stream.push({ type: "toolcall_end", contentIndex, toolCall, partial });
				}
			}
			stream.push({ type: "done", reason: partial.stopReason, message: partial });
		});
		return stream;
	};
}

const echoStep = (step, count) => ({
	calls: Array.from({ length: count }, (_, i) => ({
		id: `call-${step}-${i}`,
		name: "echo",
		arguments: { text: `step ${step} call ${i}` },
	})),
});
const history = Array.from({ length: 4000 }, (_, i) =>
	i % 2 === 0 ? user(`message ${i}`) : assistant([{ type: "text", text: `message ${i}` }], "stop"),
);

// The labels bench_agent_loop.py looks for, and what one run must give.
const WORKLOADS = [
	{
		label: "W1_tool_heavy", // 63 steps of 3 echo calls, then text
		prompts: [user("Echo three values per step.")],
		steps: [...Array.from({ length: 63 }, (_, s) => echoStep(s + 1, 3)), { text: ["done"] }],
		messages: 1 + 63 * 4 + 1,
		warmup: 200,
		runs: 1000,
	},
	{
		label: "W2_streaming", // one step of 1,024 text deltas of 64 characters
		prompts: [user("Stream a long answer.")],
		steps: [{ text: Array.from({ length: 1024 }, (_, i) => String(i % 10).repeat(64)) }],
		messages: 2,
		warmup: 300,
		runs: 2000,
	},
	{
		label: "W3p_long_transcript_as_prompts", // 4,000 messages as prompts, 8 echo steps
		prompts: history,
		steps: [...Array.from({ length: 8 }, (_, s) => echoStep(s + 1, 1)), { text: ["done"] }],
		messages: 4000 + 8 * 2 + 1,
		warmup: 200,
		runs: 1000,
	},
];

async function runOnce(workload) {
	const context = { systemPrompt: "", messages: [], tools: [echo] };
	const config = { model: MODEL, convertToLlm: (messages) => messages, toolExecution: "sequential" };
	const stream = agentLoop(workload.prompts, context, config, undefined, scriptedStream(workload.steps));
	let events = 0;
	for await (const _event of stream) events++;
	return { events, messages: await stream.result() };
}

const median = (samples) => samples.sort((a, b) => a - b)[Math.round(0.5 * (samples.length - 1))];

for (const workload of WORKLOADS) {
	const first = await runOnce(workload);
	const last = first.messages.at(-1);
	const failed = first.messages.some((message) => message.role === "toolResult" && message.isError);
	if (first.messages.length !== workload.messages || last.stopReason !== "stop" || failed) {
		throw new Error(`${workload.label}: ${first.messages.length} messages, last ${JSON.stringify(last).slice(0, 200)}`);
	}
	const [warmup, runs] = QUICK ? [20, 100] : [workload.warmup, workload.runs];
	for (let i = 0; i < warmup; i++) await runOnce(workload);
	const samples = [];
	for (let i = 0; i < runs; i++) {
		const start = performance.now();
		await runOnce(workload);
		samples.push((performance.now() - start) * 1000);
	}
	console.log(
		JSON.stringify({
			workload: workload.label,
			median_us: Math.round(median(samples) * 10) / 10,
			events_per_run: first.events,
			runs,
			warmup,
			pi_agent_core: version("@earendil-works/pi-agent-core"),
			pi_ai: version("@earendil-works/pi-ai"),
			node: process.version,
		}),
	);
}
