"""`rollstream serve`: a torch policy over the OpenAI-compatible HTTP API, reloadable by version."""

from pathlib import Path
from typing import Annotated

import typer

from infra.cli.common import Common, command, progress

app = typer.Typer()


@command(
    app, "serve", "serve a torch policy over HTTP (completions with token ids and logprobs) until SIGTERM"
)
def serve(
    common: Common,
    policy: Annotated[str, typer.Option("--policy", help='"tiny", "transformer" or module:factory')],
    vocab_size: Annotated[
        int | None, typer.Option("--vocab-size", help="the policy's vocabulary (default: the tokenizer's)")
    ] = None,
    weights: Annotated[
        Path | None, typer.Option("--weights", help="safetensors state dict to start from")
    ] = None,
    sha256: Annotated[str | None, typer.Option("--sha256", help="the weights file's sha256")] = None,
    version: Annotated[int, typer.Option("--version", help="the starting weights' version")] = 0,
    tokenizer: Annotated[
        str | None,
        typer.Option("--tokenizer", help="tokenizer file or module:factory (enables /tokenize and text)"),
    ] = None,
    eos_id: Annotated[
        int | None, typer.Option("--eos-id", help="token that ends a sample (default: the tokenizer's)")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="port to bind (0: any free one)")] = 8000,
    response_log: Annotated[
        Path | None, typer.Option("--response-log", help="JSONL file of every sample returned")
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", help="load each new version the learner publishes in the lake's policies table"
        ),
    ] = False,
) -> int:
    from urllib.parse import urlsplit

    from infra.metrics_endpoints import register, registration_path, unregister, url_for
    from infra.serve import ServeOptions, build_server, run

    settings = common.settings()
    options = ServeOptions(
        policy=policy,
        vocab_size=vocab_size,
        weights=weights,
        sha256=sha256,
        version=version,
        tokenizer=tokenizer,
        eos_id=eos_id,
        host=host,
        port=port,
        response_log=response_log,
        follow_lake=settings.lake_uri if follow else None,
    )
    server = build_server(options)

    def announce(url: str) -> None:
        listening = urlsplit(url)
        register(settings.state_dir, "serve", url_for(listening.hostname or host, listening.port or port))
        print(f"listening on {url}", flush=True)
        progress(f"serve: {policy} version {server.backend.version} at {url}; SIGTERM or Ctrl-C stops it")

    try:
        return run(server, host=host, port=port, announce=announce)
    finally:
        unregister(registration_path(settings.state_dir, "serve"))
