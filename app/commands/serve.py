"""`specfinops serve`: an OpenAI-compatible HTTP API over the batched speculative engine."""

from __future__ import annotations

import argparse
import json
import sys

from app.commands._common import (
    DTYPE_HELP,
    MAX_K,
    add_command,
    add_db_option,
    bindable_port,
    check_power_options,
    check_recording_options,
    context_len,
    model_option,
    open_db_option,
    positive_int,
    printable_name,
)
from app.commands.bench import node_id
from serving.lookahead import DEFAULT_K, fixed_k_zero

DEFAULT_DRAIN_S = 5.0  # serving.server_setup.DEFAULT_DRAIN_S (not imported here: --help loads no server code)

EXAMPLES = """  specfinops serve --db sqlite:///var/specfinops.db --port 8000
  specfinops serve --drafter early-exit --early-exit-layers 12 --k 3 --max-batch 16
  specfinops serve --api-key secret --host 127.0.0.1 --port 8000 --no-telemetry
  specfinops serve --allowed-origins http://localhost:3000 --api-key secret   # a browser chat UI on :3000
  curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
       -H 'Authorization: Bearer secret' \\
       -d '{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], "speculative": false}'
"""


def register(sub) -> None:
    p = add_command(sub, "serve", "Serve /v1/chat/completions, /v1/completions, /metrics and /health; "
                    "record every request.", EXAMPLES, handle)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port")
    p.add_argument("--drafter", default=None, help="draft | draft+ngram | early-exit | ngram (default: draft+ngram with the bundled target, ngram with any other)")
    p.add_argument("--k", default=DEFAULT_K, help=f"lookahead: an integer K in 0..{MAX_K} (0 = no drafting: "
                   "a plain AR server, every request served and recorded as AR; a drafter option beside it is noted and "
                   "left unused, no drafter loaded), or "
                   f"heuristic | entropy | cost | auto (default: {DEFAULT_K})")
    p.add_argument("--tree", default=None, metavar="NODES[:DEPTH[:WIDTH[:MIN_PROB]]]",
                   help="draft token trees instead of one chain (see `specfinops bench --help`), e.g. 16:6:4:0.25")
    p.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    p.add_argument("--max-batch", type=positive_int, default=8, help="sequences decoded together (continuous batching)")
    p.add_argument("--max-len", type=context_len, default=2048,
                   help="context window (tokens): a prompt and its answer share --max-len - 1 positions (one is kept "
                        "spare), so at most --max-len - 2 prompt tokens fit")
    p.add_argument("--default-max-tokens", type=positive_int, default=None, metavar="N",
                   help="cap on the answer of a request that sends no max_tokens / max_completion_tokens (default: "
                        "none, as OpenAI and vLLM: the room left in the context window)")
    p.add_argument("--target", default=None, help="target model name or local HF directory (default: bundled)")
    p.add_argument("--draft-model", "--draft", dest="draft_model", default=None,
                   help="draft model directory, or specfinops-draft (the bundled draft) (alone: --drafter "
                        "draft+ngram with it; refused beside ngram or early-exit; --draft: as calibrate names it)")
    p.add_argument("--early-exit-layers", type=int, default=None,
                   help="target layers used by --drafter early-exit (default: 8, or half the layers of a target "
                        "with 8 or fewer)")
    p.add_argument("--served-model-name", default=None, type=printable_name,
                   help="model id clients send (default: the target's name)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    add_db_option(p)
    p.add_argument("--node-id", default=None, type=node_id, help="node id recorded with the runs (default: $SPECFINOPS_NODE_ID, else the host name)")
    p.add_argument("--no-telemetry", action="store_true",
                   help="do not record anything in the store (refused beside --db or --node-id, which only shape "
                        "the record; --power still feeds /metrics)")
    p.add_argument("--power", default="auto", help="auto | nvml | rapl | estimate | none")
    p.add_argument("--tdp-w", type=float, default=None, help="TDP in watts for --power estimate, and --power "
                   "auto's fallback where neither NVML nor RAPL can be read (labelled estimate)")
    p.add_argument("--max-waiting", type=int, default=1024, help="queued requests before 503 (overloaded)")
    p.add_argument("--graceful-s", type=float, default=30.0,
                   help="on SIGTERM, seconds in-flight requests get to finish before they are cancelled")
    p.add_argument("--drain-s", type=float, default=DEFAULT_DRAIN_S,
                   help="on SIGTERM (or a first Ctrl-C), while requests are in flight, keep listening up to this "
                        "many seconds (within "
                        "--graceful-s, which counts from the signal) with /health answering 503 "
                        "{\"status\": \"stopping\"} and new requests refused (503 shutting_down), so a load "
                        "balancer sees the node draining; an idle server stops at once; 0: close the listener at "
                        f"once (default: {DEFAULT_DRAIN_S:g})")
    p.add_argument("--allowed-origins", type=_names, default=None, metavar="ORIGINS",
                   help="CORS: the web pages (origins, scheme://host[:port]) a browser may let call this API, "
                        "comma-separated or a JSON list as vLLM takes it, e.g. http://localhost:3000; '*' for any. "
                        "Default: none, no CORS headers at all (vLLM defaults to '*'; a server that records "
                        "costs is not opened to every web page unless asked). Preflights need no API key and "
                        "are not recorded")
    p.add_argument("--allowed-methods", type=_names, default=None, metavar="METHODS",
                   help="CORS: methods allowed to those origins (comma-separated or JSON list; default: '*')")
    p.add_argument("--allowed-headers", type=_names, default=None, metavar="HEADERS",
                   help="CORS: request headers allowed to those origins (comma-separated or JSON list; default: "
                        "'*')")
    p.add_argument("--allow-credentials", action="store_true",
                   help="CORS: let those origins send cookies (refused beside --allowed-origins '*')")
    p.add_argument("--access-log", action="store_true",
                   help="log every HTTP request (uvicorn's access log: client, method, path, status); without it the "
                        "log says only what was refused (503) or cancelled, at most one line per kind each "
                        "10 s")


def _names(value: str) -> list[str]:
    """A CORS list: a JSON list of strings (vLLM's form, '["http://a:3000"]') or comma-separated names."""
    text = value.strip()
    if text.startswith("["):
        try:
            names = json.loads(text)
        except json.JSONDecodeError:
            raise argparse.ArgumentTypeError(f"not a JSON list: {value!r}") from None
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise argparse.ArgumentTypeError(f"a JSON list of strings, got {value!r}")
        return [n.strip() for n in names]
    return [n.strip() for n in text.split(",")]


def _check_k_0(args: argparse.Namespace) -> None:
    """`--k 0` drafts nothing: the server is a plain AR one (no drafter loaded, no 'spec' run). A drafter named
    beside it is taken and left unused, as bench takes --drafter and --draft-model beside --mode ar (a script
    comparing K passes them alike): said once on stderr, then dropped, so it is neither checked nor loaded.
    With --tree, --k 0 is no AR server but a conflict (--tree sets the lookahead), which the spec's check says."""
    if args.tree is not None or not fixed_k_zero(args.k):
        return
    given = [f"{flag} {value}" for flag, value in (("--drafter", args.drafter), ("--draft-model", args.draft_model),
                                                   ("--early-exit-layers", args.early_exit_layers))
             if value is not None]
    if given:
        print(f"note: --k {args.k}: a plain AR server; {', '.join(given)} {'is' if len(given) == 1 else 'are'} not "
              "used", file=sys.stderr)
        args.drafter = args.draft_model = args.early_exit_layers = None


def handle(args: argparse.Namespace) -> int:
    import logging

    from app.commands.bench import check_k, drafter_for, early_exit_layers
    from serving.kernels import resolve_dtype
    from serving.server_setup import ServeOptions, serve
    from serving.worker import EngineSpec, default_drafter, say_thread_cap

    # the meter still feeds /metrics without a store: only the store's options go unused
    check_recording_options(args.no_telemetry, [flag for flag, value in (("--db", args.db), ("--node-id", args.node_id))
                                                if value is not None])
    check_power_options(args.power, args.tdp_w)
    check_k(args.k, args.max_len)  # as bench: a K no draft reaches, or past the window, before the model loads
    _check_k_0(args)
    args.dtype = resolve_dtype(args.dtype, max_batch=args.max_batch)
    model_option("--target", args.target, "target")  # a path that is no model directory: named, before any load
    model_option("--draft-model", args.draft_model, "draft")
    # a draft model named alone runs as the bundled pair does (draft+ngram); beside ngram or early-exit, refused
    drafter = drafter_for(args.drafter, args.draft_model, "--draft-model", lambda: default_drafter(args.target))
    # as bench and calibrate: checked against the target's layers before it loads, 8 or half a small target's
    layers = early_exit_layers(args.early_exit_layers, args.target, drafter)
    spec = EngineSpec(target=args.target, drafter=drafter, draft_model=args.draft_model,
                      early_exit_layers=layers, k=args.k, dtype=args.dtype,
                      max_batch=args.max_batch, max_len=args.max_len, tree=args.tree)
    opts = ServeOptions(spec=spec, db=args.db, host=args.host, port=args.port, api_key=args.api_key,
                        telemetry=not args.no_telemetry, node_id=args.node_id, power=args.power, tdp_w=args.tdp_w,
                        served_model_name=args.served_model_name, max_waiting=args.max_waiting,
                        graceful_s=args.graceful_s, default_max_tokens=args.default_max_tokens,
                        access_log=args.access_log, drain_s=args.drain_s, allowed_origins=args.allowed_origins,
                        allowed_methods=args.allowed_methods, allowed_headers=args.allowed_headers,
                        allow_credentials=args.allow_credentials)
    opts.validate()  # cheap checks before loading a model
    bindable_port(args.host, args.port)  # a busy port or a bad --host now, not after minutes of loading
    from serving.server_setup import power_source

    source = power_source(opts)  # likewise a meter that cannot be read (--power nvml / rapl), before a store is made
    try:
        if not args.no_telemetry:
            open_db_option(args.db).dispose()  # likewise an unusable or read-only --db
    except BaseException:
        source.close()
        raise
    logging.getLogger("serving").setLevel(logging.INFO)
    say_thread_cap()  # as bench: the runs it records would measure part of the machine, priced as the whole node
    print(f"loading target ({args.dtype}) ...", file=sys.stderr)
    serve(opts, log_level="debug" if args.verbose else "info", source=source)  # the meter opened once
    return 0
