"""`course serve` under load: what the HTTP path costs, and what a server must survive.

    python benchmarks/server.py [--clients 64] [--requests 256] [--runs 3] [--seed 0]
                                [--threads 1] [--clients-in-process] [--raw-clients]
                                [--default-allocator] [--pure-python-http] [--quick]

The workload: `--requests` requests whose prompts and answer lengths are drawn as chapter 8's
trace draws them (`poisson_trace`, utils/serving.py: prompts of 4-60 tokens cut from the plays,
answers of 16-160 tokens; greedy, `ignore_eos` through the extra body, so that every request
writes exactly its length), sent by `--clients` clients in a **closed loop**: each client sends
its next request as soon as its previous answer has ended, so that `--clients` requests are in
flight at every moment until the list runs out. The engine (chapter 8's, `max_num_seqs` =
`--clients`, 512 tokens a step, blocks of 16) gets a pool of about a quarter of the KV positions
the whole run writes, so that blocks must be freed and reused.

Two ways to serve the same requests, in this process, alternating, `--runs` times each:

- `engine`: the engine driven directly by a loop that adds a client's next request when its
  previous one finishes (no HTTP, no text);
- `server`: the same engine behind `course serve`'s app (uvicorn in a thread of this process),
  and the clients: asyncio tasks with the official `AsyncOpenAI` client, streaming
  (`stream_options.include_usage`), in a process of their own (a load generator is not the
  server's cost; `--clients-in-process` runs them in a thread of this one instead;
  `--raw-clients` streams with httpx and parses the events by hand, a load generator that
  takes less of the machine than the official client, which builds an object per chunk).

With `--pure-python-http`, each run also serves the requests on uvicorn's pure-Python HTTP
parser and event loop (h11, asyncio) instead of the compiled ones the course installs
(httptools, uvloop), in an order that rotates between runs: what those two save.

Per method: throughput (answer tokens / the time from the first request sent to the last
token), time to first token (TTFT, from a request's sending, or its adding, to its first token)
and time per output token after the first (TPOT), medians and 99th percentiles, from the run
whose throughput ratio is the median (every run's ratio listed). Each server run checks that
every request completed with its length, and afterwards, in the engine's loop, that no block is
held (and none in a request's table) and how many times a freed block was handed
out again (`blocks_reused`). Then one more server run with a quarter of the clients leaving at
random (each of their requests closed after a uniform random number of its tokens): the same
checks, each leaver's request aborted in the engine. Then a shutdown under load: SIGTERM's
handler called with every client's request in flight; each must end with `finish_reason`
"abort" and the server must exit. Prints one JSON object, with the goal: the HTTP path costs at
most 15 % of the engine's throughput (`utils/records.goal`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import subprocess
import sys
import threading
import time

from utils import REPO_ROOT
from utils.records import add_record_options, emit, goal, machine, median_run, verdict

MODEL = "shakespeare"
BLOCK_SIZE = 16
BUDGET = 512  # tokens a step
SHUTDOWN_TOKENS = 180  # with a prompt of up to 60 tokens, within n_ctx = 256
PURE_PYTHON = {"http": "h11", "loop": "asyncio"}  # uvicorn without httptools and uvloop


# ------------------------------------------------------------------------------- the clients
# Light imports only above and in this part: the clients' process imports this module again.


async def closed_loop(
    url: str, requests: list[dict], clients: int, leavers: int = 0, seed: int = 0,
    raw: bool = False,
) -> dict:  # fmt: skip
    """`clients` asyncio tasks, each sending the next of `requests` as soon as its previous
    answer ends, streamed through `AsyncOpenAI` (or, `raw`, httpx with the events parsed by
    hand: a cheaper load generator); the first `leavers` of them close each of their streams
    after a random number of tokens. Per request: when it was sent, its first and last tokens
    came (seconds from the start), its text, tokens, finish reason and the server's id."""
    import httpx
    import openai

    aclient = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    http = httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None))
    rng, queue, results = random.Random(seed), list(reversed(requests)), {}
    start = time.perf_counter()

    async def chunks(r: dict):
        """(id, completion tokens or None, text, finish reason) of each streamed chunk."""
        body = {"model": MODEL, "prompt": r["prompt"], "max_tokens": r["max_tokens"],
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                "ignore_eos": True}  # fmt: skip
        if raw:
            async with http.stream("POST", url + "/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        c = json.loads(line[6:])
                        usage = c["usage"]["completion_tokens"] if c.get("usage") else None
                        choice = c["choices"][0] if c["choices"] else {}
                        yield c["id"], usage, choice.get("text"), choice.get("finish_reason")
            return
        extra = {"extra_body": {"ignore_eos": body.pop("ignore_eos")}}
        stream = await aclient.completions.create(**body, **extra)
        try:
            async for c in stream:
                usage = c.usage.completion_tokens if c.usage is not None else None
                choice = c.choices[0] if c.choices else None
                yield (c.id, usage, choice and choice.text, choice and choice.finish_reason)
        finally:
            await stream.close()  # closed early: the connection closes, the server must abort

    async def client(leaves: bool) -> None:
        while queue:
            r = queue.pop()
            leave_after = rng.randint(1, r["max_tokens"]) if leaves else None
            sent, first, last, texts = time.perf_counter() - start, None, None, []
            tokens, reason, server_id = 0, None, None
            events = chunks(r)
            async for chunk_id, usage, text, finish_reason in events:
                server_id = chunk_id
                tokens = usage if usage is not None else tokens
                reason = finish_reason or reason
                if text:
                    last = time.perf_counter() - start
                    first = last if first is None else first
                    texts.append(text)
                    if leave_after is not None and len(texts) >= leave_after:
                        reason = "left"
                        break
            await events.aclose()
            results[r["request_id"]] = {"sent": sent, "first": first, "last": last,
                                        "text": "".join(texts), "tokens": tokens,
                                        "reason": reason, "id": server_id}  # fmt: skip

    await asyncio.gather(*(client(i < leavers) for i in range(clients)))
    await aclient.close()
    await http.aclose()
    return results


def clients_worker() -> None:
    """The clients' process (`--clients-worker`): runs `closed_loop` for each job, one JSON line
    in on stdin, one out on stdout."""
    for line in sys.stdin:
        print(json.dumps(asyncio.run(closed_loop(**json.loads(line)))), flush=True)


class Clients:
    """The load generator, in a process of its own (started once), or in a thread of this one."""

    def __init__(self, in_process: bool, raw: bool = False):
        self.process, self.raw = None, raw
        if not in_process:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.server", "--clients-worker"], cwd=REPO_ROOT,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip

    def run(self, **job) -> dict:
        job["raw"] = self.raw
        if self.process is None:
            box = {}
            thread = threading.Thread(
                target=lambda: box.update(out=asyncio.run(closed_loop(**job)))
            )
            thread.start()
            thread.join()
            return box["out"]
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the clients' process ended without an answer (see its stderr)")
        return json.loads(line)

    def close(self) -> None:
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait(30)


# ----------------------------------------------------------------------------- the two paths


def pool_blocks(requests) -> tuple[int, int]:
    """(KV positions the run writes, blocks of a pool that holds about a quarter of them; never
    fewer than the largest request needs)."""
    written = sum(len(r.prompt) + r.max_tokens - 1 for r in requests)
    largest = max(math.ceil((len(r.prompt) + r.max_tokens - 1) / BLOCK_SIZE) for r in requests)
    return written, max(math.ceil(written / 4 / BLOCK_SIZE), largest)


def new_engine(model, tokenizer, num_blocks: int, clients: int):
    """A fresh engine (an empty prefix cache)."""
    from solutions.engine import LLMEngine

    return LLMEngine(model, tokenizer, num_blocks=num_blocks, block_size=BLOCK_SIZE,
                     max_num_batched_tokens=BUDGET, max_num_seqs=clients)  # fmt: skip


def pool_report(engine) -> dict:
    """After a run, from the engine's report (`engine.stats`): nothing runs, so every block
    must be free and no request may hold one. Blocks still in use are leaked; `blocks_reused`
    counts the blocks handed out again after being freed, `preemptions` the requests that gave
    theirs back to make room."""
    stats = engine.stats
    holders = sum(1 for r in engine.requests.values() if r.block_ids)
    return {"blocks_leaked": stats.blocks_in_use, "requests_holding_blocks": holders,
            "requests_unfinished": stats.running + stats.waiting,
            "blocks_reused": stats.blocks_reused, "preemptions": stats.preemptions}  # fmt: skip


def drive_engine(model, tokenizer, requests, clients: int, num_blocks: int):
    """The engine alone, in the same closed loop: a finished request's client adds the next."""
    from solutions.sampling_params import SamplingParams
    from utils.serving import Served

    engine = new_engine(model, tokenizer, num_blocks, clients)
    served, sent, queue = Served(), {}, list(reversed(requests))
    start = time.perf_counter()

    def add_next() -> None:
        if queue:
            r = queue.pop()
            params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
            sent[r.request_id] = time.perf_counter() - start
            engine.add_request(r.request_id, r.prompt, params)

    for _ in range(clients):
        add_next()
    while engine.has_unfinished_requests():
        for _ in served.record(engine.step(), time.perf_counter() - start):
            add_next()  # a finished request's client sends its next
    return served, sent, engine


def summary(requests, served, sent) -> dict:
    """utils/serving.py's summary, each request's arrival being when it was sent."""
    import dataclasses

    timed = [dataclasses.replace(r, arrival=sent[r.request_id]) for r in requests]
    return served.summary(timed)


def serve_over_http(model, tokenizer, requests, clients: int, num_blocks: int, load: Clients,
                    leavers: int = 0, seed: int = 0, uvicorn_config=None):  # fmt: skip
    """The same requests through the server and the clients; the results, and the pool's
    report read in the engine's loop once nothing runs."""
    from solutions.async_engine import AsyncEngine
    from utils.server import running_server
    from utils.serving import Served

    engine = new_engine(model, tokenizer, num_blocks, clients)
    async_engine = AsyncEngine(engine)
    jobs = [{"request_id": r.request_id, "prompt": r.prompt, "max_tokens": r.max_tokens}
            for r in requests]  # fmt: skip
    with running_server(async_engine, MODEL, **(uvicorn_config or {})) as running:
        results = load.run(url=running.url, requests=jobs, clients=clients, leavers=leavers,
                           seed=seed)  # fmt: skip
        deadline = time.monotonic() + 60
        while async_engine.call(lambda e: e.has_unfinished_requests()).result(60):
            if time.monotonic() > deadline:
                raise RuntimeError("the engine still runs requests after every client is gone")
            time.sleep(0.01)
        report = async_engine.call(pool_report).result(60)
        ends = async_engine.call(
            lambda e: {rid: r.finish_reason for rid, r in e.requests.items()}
        ).result(60)
    served = Served()
    for request_id, r in results.items():
        if r["first"] is not None:
            served.first[request_id], served.last[request_id] = r["first"], r["last"]
    sent = {request_id: r["sent"] for request_id, r in results.items()}
    return served, sent, results, report, ends


def shutdown_under_load(model, tokenizer, requests, clients: int, num_blocks: int) -> dict:
    """A request from every client in flight (streamed from this process, each asking for 180
    tokens: none ends on its own before the shutdown), then what SIGTERM calls: each must end
    with "abort", and the server's thread must end."""
    import signal

    import openai

    from solutions.async_engine import AsyncEngine
    from utils.server import running_server

    # A pool for every request at once: the shutdown, not the pool, is what is checked here.
    longest = max(len(r.prompt) for r in requests) + SHUTDOWN_TOKENS
    num_blocks = max(num_blocks, clients * math.ceil(longest / BLOCK_SIZE))
    async_engine = AsyncEngine(new_engine(model, tokenizer, num_blocks, clients))
    with running_server(async_engine, MODEL) as running:

        async def in_flight():
            aclient = openai.AsyncOpenAI(base_url=running.url, api_key="none", max_retries=0)
            every_one_writing, writing, reasons = asyncio.Event(), set(), []

            async def one(i, r):
                stream = await aclient.completions.create(
                    model=MODEL, prompt=r.prompt, max_tokens=SHUTDOWN_TOKENS, temperature=0,
                    stream=True, extra_body={"ignore_eos": True},
                )  # fmt: skip
                reason = None
                async for chunk in stream:
                    reason = chunk.choices[0].finish_reason or reason
                    if chunk.choices[0].text:
                        writing.add(i)
                        if len(writing) == clients:
                            every_one_writing.set()
                reasons.append(reason)

            tasks = [asyncio.ensure_future(one(i, r)) for i, r in enumerate(requests[:clients])]
            # The signal as soon as every request has written its first text, not after a fixed
            # pause: a pause long enough on a slow machine lets a fast one finish the answers.
            await every_one_writing.wait()
            start = time.perf_counter()
            running.server.handle_exit(signal.SIGTERM, None)
            await asyncio.gather(*tasks)
            return reasons, start

        reasons, start = asyncio.run(in_flight())
        running.thread.join(30)
        seconds = time.perf_counter() - start
        exited = not running.thread.is_alive()
    return {"in_flight": len(reasons), "ended_with_abort": reasons.count("abort"),
            "ended_otherwise": len(reasons) - reasons.count("abort"), "server_exited": exited,
            "seconds_to_exit": round(seconds, 2)}  # fmt: skip


# ---------------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3, help="engine and server, alternating")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="PyTorch intra-op threads")
    parser.add_argument(
        "--clients-in-process", action="store_true", help="the clients in a thread of this process"
    )
    parser.add_argument("--default-allocator", action="store_true",
                        help="leave glibc's malloc settings alone")  # fmt: skip
    parser.add_argument(
        "--raw-clients", action="store_true", help="httpx clients instead of AsyncOpenAI"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke test: 8 clients, 16 short requests, 1 run"
    )
    parser.add_argument(
        "--pure-python-http", action="store_true",
        help="also serve on uvicorn's pure-Python HTTP parser and loop, in the same runs",
    )  # fmt: skip
    parser.add_argument("--clients-worker", action="store_true", help=argparse.SUPPRESS)
    add_record_options(parser)
    args = parser.parse_args()
    args.answer_lens = (16, 160)
    if args.quick:
        args.clients, args.requests, args.runs, args.answer_lens = 8, 16, 1, (8, 24)
    if args.clients < 4 or args.requests < args.clients or args.runs < 1:
        parser.error("--clients >= 4, --requests >= --clients, --runs >= 1")
    return args


def engine_run(model, tokenizer, requests, clients: int, num_blocks: int) -> dict:
    """The engine driven directly: its summary and pool report, and each request's text."""
    served, sent, engine = drive_engine(model, tokenizer, requests, clients, num_blocks)
    return {
        "engine": {**summary(requests, served, sent), **pool_report(engine)},
        "engine_texts": {k: tokenizer.decode(v, skip_special_tokens=True)
                         for k, v in served.tokens.items()},
    }  # fmt: skip


def server_run(model, tokenizer, requests, clients: int, num_blocks: int, load: Clients,
               method: str) -> dict:  # fmt: skip
    """The server (`method` "server_pure_python": on uvicorn's pure-Python HTTP): its summary,
    pool report and complete requests (and, for "server", each request's text)."""
    served, sent, results, report, _ = serve_over_http(
        model, tokenizer, requests, clients, num_blocks, load,
        uvicorn_config=PURE_PYTHON if method != "server" else None,
    )  # fmt: skip
    complete = sum(1 for r in requests
                   if results.get(r.request_id, {}).get("tokens") == r.max_tokens
                   and results[r.request_id]["reason"] == "length")  # fmt: skip
    row = {method: {**summary(requests, served, sent), **report, "requests_complete": complete}}
    if method == "server":
        row["server_texts"] = {k: r["text"] for k, r in results.items()}
    return row


def alternate(model, tokenizer, requests, args, num_blocks: int, load: Clients) -> list[dict]:
    """The engine and the server (and the pure-Python server, in an order that rotates),
    `--runs` times, alternating: each run's reports and the server's tokens/s over the
    engine's."""
    runs = []
    for run in range(args.runs):
        order = ["engine", "server"] if run % 2 == 0 else ["server", "engine"]
        if args.pure_python_http:
            order.insert(run % 3, "server_pure_python")
        row = {}
        for method in order:
            if method == "engine":
                row.update(engine_run(model, tokenizer, requests, args.clients, num_blocks))
            else:
                row.update(server_run(model, tokenizer, requests, args.clients, num_blocks, load,
                                      method))  # fmt: skip
        row["ratio"] = row["server"]["tokens_per_s"] / row["engine"]["tokens_per_s"]
        if args.pure_python_http:
            row["pure_python_ratio"] = round(
                row["server_pure_python"]["tokens_per_s"] / row["engine"]["tokens_per_s"], 3
            )
        runs.append(row)
        print(f"run {run + 1} of {args.runs}: server / engine {row['ratio']:.3f}"
              + (f", pure-Python HTTP {row['pure_python_ratio']}" if args.pure_python_http
                 else ""), flush=True, file=sys.stderr)  # fmt: skip
    return runs


def with_leavers(model, tokenizer, requests, args, num_blocks: int, load: Clients) -> dict:
    """One more server run, a quarter of the clients leaving at random: what became of the
    leavers' requests and of the others, and the pool's report."""
    leavers = args.clients // 4
    served, sent, results, report, ends = serve_over_http(
        model, tokenizer, requests, args.clients, num_blocks, load, leavers=leavers,
        seed=args.seed,
    )  # fmt: skip
    left = [r["id"] for r in results.values() if r["reason"] == "left"]
    stayed = [r for r in requests if results[r.request_id]["reason"] != "left"]
    return {
        "clients_leaving": leavers,
        "requests_left": len(left),
        "left_requests_aborted_in_the_engine": sum(ends[k] == "abort" for k in left),
        "left_requests_finished_first": sum(ends[k] == "length" for k in left),
        "other_requests": len(stayed),
        "other_requests_complete": sum(
            results[r.request_id]["tokens"] == r.max_tokens
            and results[r.request_id]["reason"] == "length" for r in stayed
        ),
        "requests_answered": len(results),
        **report,
    }  # fmt: skip


def server_goals(runs: list[dict], ratio: float, requests, disconnects: dict,
                 shutdown: dict) -> dict:  # fmt: skip
    """The goal of speed and the verdicts of survival."""
    servers = [r["server"] for r in runs]
    pools = [*servers, disconnects]  # every server run's pool report
    left = disconnects["requests_left"]
    return {
        "http_costs_at_most_15_percent_of_throughput": goal(
            "the server's tokens/s / the engine's, driven directly (median of the runs' ratios)",
            ratio, 0.85, at_least=True,
        ),
        "every_request_completes": verdict(
            all(r["requests_complete"] == len(requests) for r in servers),
            measured=[r["requests_complete"] for r in servers], expected=len(requests),
        ),
        "no_block_leaked": verdict(
            all(not r["blocks_leaked"] and not r["requests_holding_blocks"]
                and not r["requests_unfinished"] for r in pools),
            measured=[r["blocks_leaked"] for r in pools],
        ),
        "freed_blocks_reused": verdict(
            all(r["blocks_reused"] > 0 for r in pools),
            measured=[r["blocks_reused"] for r in pools],
        ),
        "disconnects_aborted_and_others_complete": verdict(
            disconnects["left_requests_aborted_in_the_engine"]
            + disconnects["left_requests_finished_first"] == left
            and disconnects["other_requests_complete"] == disconnects["other_requests"]
            and disconnects["requests_answered"] == len(requests)
            and not disconnects["blocks_leaked"] and not disconnects["requests_holding_blocks"],
            measured=disconnects,
        ),
        "shutdown_aborts_every_request_and_exits": verdict(
            shutdown["ended_with_abort"] == shutdown["in_flight"] and shutdown["server_exited"],
            measured=shutdown,
        ),
    }  # fmt: skip


def main() -> None:
    args = parse_args()
    if args.clients_worker:
        return clients_worker()

    import torch

    from benchmarks.serving import keep_freed_memory
    from utils.models import load_model
    from utils.serving import poisson_trace

    torch.set_num_threads(args.threads)
    allocator = "default" if args.default_allocator else keep_freed_memory()
    load = Clients(args.clients_in_process, args.raw_clients)
    model, tokenizer = load_model(MODEL)
    model.eval()
    requests = poisson_trace(tokenizer, args.requests, 40.0, args.seed,
                             answer_lens=args.answer_lens)  # fmt: skip
    written, num_blocks = pool_blocks(requests)
    warm = requests[: args.clients // 2]
    drive_engine(model, tokenizer, warm, args.clients, num_blocks)  # first calls allocate
    serve_over_http(model, tokenizer, warm, args.clients, num_blocks, load)  # and import

    runs = alternate(model, tokenizer, requests, args, num_blocks, load)
    ratios = [r["ratio"] for r in runs]
    reported = median_run(runs, key=lambda r: r["ratio"])
    same_text = sum(
        r["engine_texts"].get(k) == v for r in runs for k, v in r["server_texts"].items()
    )
    disconnects = with_leavers(model, tokenizer, requests, args, num_blocks, load)
    load.close()
    shutdown = shutdown_under_load(model, tokenizer, requests, args.clients, num_blocks)
    ratio = round(statistics.median(ratios), 3)
    goals = server_goals(runs, ratio, requests, disconnects, shutdown)
    for r in runs:
        del r["engine_texts"], r["server_texts"]
        r["ratio"] = round(r["ratio"], 3)
    emit({
        "machine": {**machine(), "allocator": allocator},
        "workload": {"clients": args.clients, "requests": args.requests, "seed": args.seed,
                     "prompt_tokens": "4-60, cut from the plays",
                     "answer_tokens": sum(r.max_tokens for r in requests),
                     "answer_lens": list(args.answer_lens),
                     "kv_positions_written": written, "num_blocks": num_blocks,
                     "block_size": BLOCK_SIZE, "pool_fraction_of_written":
                     round(num_blocks * BLOCK_SIZE / written, 3),
                     "max_num_seqs": args.clients, "max_num_batched_tokens": BUDGET},
        "clients": f"asyncio tasks with {'httpx' if args.raw_clients else 'AsyncOpenAI'}, "
                   "streaming, in "
                   + ("a thread of the server's process" if args.clients_in_process
                      else "a process of their own"),
        "throughput_ratio_per_run": [round(x, 3) for x in ratios],
        **({"pure_python_http": {
            "what": "the same server on uvicorn's pure-Python parser and loop (h11, asyncio) "
                    "instead of httptools and uvloop, in the same runs",
            "throughput_ratio_per_run": [r["pure_python_ratio"] for r in runs],
            "median": statistics.median(r["pure_python_ratio"] for r in runs),
        }} if args.pure_python_http else {}),
        "engine": reported["engine"], "server": reported["server"],
        "runs": runs,
        "same_text_as_the_engine": {"requests": same_text, "of": len(requests) * len(runs)},
        "disconnects": disconnects,
        "shutdown": shutdown,
        "goals": goals,
    }, args)  # fmt: skip


if __name__ == "__main__":
    main()
