"""The env's tools over MCP (the official `mcp` SDK), one episode per harness (`gymfoundry serve-env`).

An episode is named by the address the harness connects to, `/episodes/<name>/mcp`; on the plain
`/mcp` address by the `X-Gymfoundry-Episode` header or, for a client of the stateful (2025) protocol,
its MCP session id. Under stdio the one connection is one episode. The session shows:

- the prompt `task` and the resource `gymfoundry://episode/goal`: the task's goal, as the factory's
  policies see it (the reset observation);
- the family's tools, with the JSON schemas they were declared with; every call goes through the
  episode's runtime stack (tasks/harness.py), and a bad call is an error result, never a crash.

Nothing else: no state, no hidden field, no verdict. The episode ends when the env ends it, when
the harness posts `/episodes/<name>/finish`, when a stateful client deletes its session, or when it
stays idle past the hub's limit; then it is verified, scored and landed as a factory rollout."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.shared.exceptions import MCPError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tasks.harness import EPISODE_NAME, EpisodeHub, TooManyEpisodes

EPISODE_HEADER = "x-gymfoundry-episode"
GOAL_URI = "gymfoundry://episode/goal"
INVALID_PARAMS = -32602


def episode_name(request: Any, default: str | None = None) -> str:
    """The episode a request belongs to: the address's name, the header, the MCP session id."""
    if request is None:  # stdio: the one connection
        if default is None:
            raise MCPError(INVALID_PARAMS, "no episode")
        return default
    name = (request.path_params.get("episode") or request.headers.get(EPISODE_HEADER)
            or request.headers.get("mcp-session-id"))
    if not name or not EPISODE_NAME.fullmatch(name):
        raise MCPError(INVALID_PARAMS, "name the episode: connect to /episodes/<name>/mcp (letters, digits, '_.-')")
    return name


def build_server(hub: EpisodeHub, stdio_episode: str | None = None) -> Server:
    """The MCP server of `hub`'s family. Env work runs in worker threads: a slow tool (a sandbox)
    holds its own episode only, never the event loop the other sessions share."""

    def name(ctx) -> str:
        return episode_name(ctx.request, stdio_episode)

    # One episode's requests wait for each other here, in the event loop, not in worker threads: the
    # threads are shared by every session (anyio's 40), and a harness flooding its own slow episode
    # with calls would otherwise hold them all while they wait for that episode's lock.
    queues: dict[str, anyio.Lock] = {}

    async def hub_call(fn, episode: str, *args):
        try:
            async with queues.setdefault(episode, anyio.Lock()):
                return await anyio.to_thread.run_sync(fn, episode, *args)
        except TooManyEpisodes as exc:  # the harness's request, said as such (not an internal error)
            raise MCPError(INVALID_PARAMS, str(exc)) from None

    async def list_tools(ctx, params) -> types.ListToolsResult:
        schemas = await hub_call(hub.tools, name(ctx))
        return types.ListToolsResult(tools=[
            types.Tool(name=s["function"]["name"], description=s["function"]["description"],
                       input_schema=s["function"]["parameters"]) for s in schemas])

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        text, is_error = await hub_call(hub.call, name(ctx), params.name, params.arguments)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=is_error)

    async def list_prompts(ctx, params) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(name="task", description="the task to accomplish")])

    async def get_prompt(ctx, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        if params.name != "task":
            raise MCPError(INVALID_PARAMS, f"no prompt {params.name[:80]!r}; the prompt is 'task'")
        goal = await hub_call(hub.goal, name(ctx))
        return types.GetPromptResult(description="the task to accomplish", messages=[
            types.PromptMessage(role="user", content=types.TextContent(type="text", text=goal))])

    async def list_resources(ctx, params) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(uri=GOAL_URI, name="goal", description="the task to accomplish", mime_type="text/plain")])

    async def read_resource(ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        if str(params.uri) != GOAL_URI:
            raise MCPError(INVALID_PARAMS, f"no resource {str(params.uri)[:80]!r}; the resource is {GOAL_URI}")
        goal = await hub_call(hub.goal, name(ctx))
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=GOAL_URI, text=goal,
                                                                             mime_type="text/plain")])

    return Server(f"gymfoundry-{hub.family}", version="1", on_list_tools=list_tools, on_call_tool=call_tool,
                  on_list_prompts=list_prompts, on_get_prompt=get_prompt, on_list_resources=list_resources,
                  on_read_resource=read_resource)


class _Episodes:
    """The MCP endpoint at `/episodes/<name>/mcp`: refuses a bad name before MCP sees it, and ends
    the episode when a stateful client deletes its session."""

    def __init__(self, hub: EpisodeHub, app: Any):
        self.hub, self.app = hub, app

    async def __call__(self, scope, receive, send) -> None:
        request = Request(scope)
        named = request.path_params.get("episode")
        if named is not None and not EPISODE_NAME.fullmatch(named):
            await JSONResponse({"error": "bad episode name"}, status_code=404)(scope, receive, send)
            return
        ended = named or request.headers.get(EPISODE_HEADER) or request.headers.get("mcp-session-id")
        if request.method == "DELETE" and ended in self.hub:  # ended before the client hears it is closed
            await anyio.to_thread.run_sync(self.hub.finish, ended)
        await self.app(scope, receive, send)


def build_app(hub: EpisodeHub, host: str = "127.0.0.1"):
    """The streamable-HTTP app: `/mcp`, `/episodes/<name>/mcp`, and `POST /episodes/<name>/finish`
    (the episode's rollout and task ids as JSON; never its class: a verdict shown to the harness
    would let it probe a task in one episode and play it again, knowing, in another)."""
    server = build_server(hub)
    app = server.streamable_http_app(host=host, session_idle_timeout=None)
    endpoint = _Episodes(hub, StreamableHTTPASGIApp(server.session_manager))

    async def finish(request: Request) -> JSONResponse:
        name = request.path_params["episode"]
        if not EPISODE_NAME.fullmatch(name) or name not in hub:
            return JSONResponse({"error": f"no episode {name[:80]!r}"}, status_code=404)
        rollout = await anyio.to_thread.run_sync(hub.finish, name)
        return JSONResponse({"episode": name, "rollout_id": rollout.rollout_id, "task_id": rollout.task_id})

    app.router.routes[:] = [Route("/mcp", endpoint=endpoint), Route("/episodes/{episode}/mcp", endpoint=endpoint),
                            Route("/episodes/{episode}/finish", endpoint=finish, methods=["POST"])]
    return app


async def serve_stdio(hub: EpisodeHub, episode: str) -> None:
    """One episode over stdin/stdout; it ends (and lands) when the client closes the connection."""
    from mcp.server.stdio import stdio_server

    server = build_server(hub, stdio_episode=episode)
    try:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        if episode in hub:  # a connection that never asked for anything played no episode
            await anyio.to_thread.run_sync(hub.finish, episode)


@contextlib.contextmanager
def served(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a thread (port 0: any free one); yields its base URL
    (`http://host:port`) and stops it on exit."""
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=5, backlog=512))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server on {host}:{port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)
