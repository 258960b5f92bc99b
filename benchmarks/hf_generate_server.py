"""transformers' ``generate`` behind the HTTP API of ``ctxkit serve``'s ``POST /generate``, one request at a time.

The peer of ``serve_generate.py``: a GPT-2 folder (HF layout) loaded with
``transformers.GPT2LMHeadModel.from_pretrained`` and served by a FastAPI app on uvicorn,
speaking the generation server's request (``prompt``, ``max_new_tokens``, ``temperature``,
``top_k``, ``top_p``, ``seed``, ``stream``) and answer: ``data: {"text": piece}`` events, a
final ``{"finish_reason", "prompt_tokens", "completion_tokens"}`` event and ``data: [DONE]``.
The prompt is encoded and the pieces are cut by ctxkit's own tokenizer and
:class:`~ctxkit.decoding.streamers.StopStringText`, as the generation server does, so both
stream the same kind of events. Requests run one at a time (a single worker thread);
``generate`` uses ``cache_implementation="static"`` sized to the model's context (on a GPU
transformers compiles its decoding step itself). If a static-cache ``generate`` fails (a
transformers or torch without it), the server falls back to the dynamic cache and says so in
``/health`` (``cache``, ``static_error``).

    PYTHONPATH=src python benchmarks/hf_generate_server.py FOLDER --port 8001 --device cuda
"""

# No `from __future__ import annotations`: FastAPI reads the route's body type at run time.
import argparse
import asyncio
import concurrent.futures
import json

import torch

from ctxkit.decoding.streamers import StopStringText
from ctxkit.tokenizers import ByteLevelBPETokenizer


class _Pieces:
    """A ``generate`` streamer: each new token through StopStringText, pieces handed to ``emit``."""

    def __init__(self, tokenizer, eos, emit):
        self.text = StopStringText(tokenizer)
        self.eos, self.emit = eos, emit
        self.prompt_seen = False
        self.tokens = 0
        self.ended = False  # end-of-text was drawn (it is counted, not sent, as the generation server does)

    def put(self, value) -> None:
        if not self.prompt_seen:  # generate() hands the prompt over first
            self.prompt_seen = True
            return
        for token in value.reshape(-1).tolist():
            if self.ended:
                continue
            self.tokens += 1
            if token == self.eos:
                self.ended = True
                continue
            piece = self.text.push(token)
            if piece:
                self.emit(piece)

    def end(self) -> None:
        piece = self.text.flush()
        if piece:
            self.emit(piece)


def create_app(folder: str, device: str = "cpu", dtype: str = "float32", cache: str = "static"):
    """The peer's app: ``POST /generate`` and ``GET /health``."""
    import transformers
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse
    from transformers.generation.streamers import BaseStreamer

    class Streamer(_Pieces, BaseStreamer):
        pass

    model = transformers.GPT2LMHeadModel.from_pretrained(folder, dtype=getattr(torch, dtype)).to(device).eval()
    tokenizer = ByteLevelBPETokenizer.from_dir(folder)
    eos = tokenizer.eos_id
    context = model.config.n_positions
    sized = "max_cache_len" in transformers.GenerationConfig().to_dict()  # newer transformers size the static cache
    state = {"cache": cache, "static_error": None, "served": 0}
    worker = concurrent.futures.ThreadPoolExecutor(max_workers=1)  # one request at a time

    def run(body: dict, streamer) -> None:
        ids = torch.tensor([tokenizer.encode(body["prompt"])], device=device)
        temperature = float(body.get("temperature", 1.0))
        options = {"max_new_tokens": int(body.get("max_new_tokens", 64)), "do_sample": temperature > 0,
                   "eos_token_id": eos, "pad_token_id": eos, "streamer": streamer}
        if temperature > 0:
            options.update(temperature=temperature, top_k=int(body.get("top_k", 0)), top_p=float(body.get("top_p", 1.0)))
        if body.get("seed") is not None:
            torch.manual_seed(int(body["seed"]))  # the CPU's and every GPU's generator
        state["served"] += 1
        with torch.inference_mode():
            if state["cache"] == "static":
                try:
                    model.generate(ids, attention_mask=torch.ones_like(ids), cache_implementation="static",
                                   **({"max_cache_len": context} if sized else {}), **options)
                    return
                except Exception as err:  # recorded (health), then the dynamic cache
                    if streamer.tokens:
                        raise
                    state["cache"], state["static_error"] = "dynamic", f"{type(err).__name__}: {err}"[:500]
            model.generate(ids, attention_mask=torch.ones_like(ids), **options)

    app = FastAPI(title="transformers generate (benchmark peer)")

    def sse(payload) -> str:
        return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"

    @app.post("/generate")
    async def generate_route(body: dict):
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        streamer = Streamer(tokenizer, eos, lambda piece: loop.call_soon_threadsafe(events.put_nowait, piece))
        prompt_tokens = len(tokenizer.encode(body["prompt"]))
        job = loop.run_in_executor(worker, run, body, streamer)
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(events.put_nowait, None))

        def final() -> dict:
            job.result()  # a failed generate: the error
            reason = "stop" if streamer.ended else "length"
            return {"finish_reason": reason, "prompt_tokens": prompt_tokens, "completion_tokens": streamer.tokens}

        if body.get("stream"):
            async def stream():
                while (piece := await events.get()) is not None:
                    yield sse({"text": piece})
                yield sse(final())
                yield sse("[DONE]")

            return StreamingResponse(stream(), media_type="text/event-stream")
        parts = []
        while (piece := await events.get()) is not None:
            parts.append(piece)
        return JSONResponse({"text": "".join(parts), **final()})

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": "transformers GPT2LMHeadModel", "transformers": transformers.__version__,
                "device": device, "dtype": dtype, "cache": state["cache"], "static_error": state["static_error"],
                "served": state["served"]}

    return app


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="a GPT-2 folder in HF layout (config.json, weights, tokenizer files)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--cache", default="static", choices=("static", "dynamic"))
    args = parser.parse_args(argv)
    import uvicorn

    app = create_app(args.folder, args.device, args.dtype, args.cache)
    try:
        import httptools  # noqa: F401 - the HTTP parser ctxkit serve runs on

        http = "httptools"
    except ImportError:
        http = "auto"
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False, http=http, ws="none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
