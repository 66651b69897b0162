"""The env's tools over MCP (the official `mcp` SDK), one episode per harness (`gymfoundry serve-env`).

A harness opens an episode with `POST /episodes/<name>/open` and gets its token; every later
request about it carries `Authorization: Bearer <token>` (a missing or wrong one: 401, nothing
recorded or changed; a name not open: 404). The episode is named by the address the harness connects
to, `/episodes/<name>/mcp`, or on the plain `/mcp` address by the `X-Gymfoundry-Episode` header.
Under stdio the one connection is one episode, opened at start. The session shows:

- the prompt `task` and the resource `gymfoundry://episode/goal`: the task's goal, as the factory's
  policies see it (the reset observation);
- the family's tools, with the JSON schemas they were declared with; every call goes through the
  episode's runtime stack (tasks/harness/hub.py), and a bad call is an error result, never a crash.

Nothing else: no state, no hidden field, no verdict. The episode ends when the env ends it, when
the harness posts `/episodes/<name>/finish`, when a stateful client deletes its session, or when it
stays idle past the hub's limit; then it is verified, scored and landed as a factory rollout."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.shared.exceptions import MCPError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gymfoundry.tasks.harness.hub import (EPISODE_HEADER, EPISODE_NAME, EpisodeExists, EpisodeHub, EpisodeNotOpen, TooManyEpisodes,
                           WrongToken)
from gymfoundry.tasks.harness.http_guard import bearer, served  # noqa: F401  (tests and benchmarks serve the app through it)

log = logging.getLogger("gymfoundry.harness")
GOAL_URI = "gymfoundry://episode/goal"
INVALID_PARAMS = -32602


def episode_name(request: Any, default: str | None = None) -> str:
    """The episode a request belongs to: the address's name, the header, the MCP session id."""
    if request is None:  # stdio: the one connection
        if default is None:
            raise MCPError(INVALID_PARAMS, "no episode")
        return default
    name = request.path_params.get("episode") or request.headers.get(EPISODE_HEADER)
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
        except (TooManyEpisodes, EpisodeNotOpen) as exc:  # the harness's request, said as such (not an internal error)
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


def refused(exc: Exception) -> JSONResponse:
    """A request about an episode it does not own (401) or that is not open (404): nothing done."""
    status = 401 if isinstance(exc, WrongToken) else 404
    headers = {"www-authenticate": 'Bearer realm="gymfoundry episode"'} if status == 401 else None
    return JSONResponse({"error": str(exc)}, status_code=status, headers=headers)


class _Episodes:
    """The MCP endpoint at `/episodes/<name>/mcp` (and `/mcp` with the episode header): refuses a
    bad name, a name not open and a request without the episode's token before MCP sees it, and ends
    the episode when a stateful client deletes its session."""

    def __init__(self, hub: EpisodeHub, app: Any):
        self.hub, self.app = hub, app

    async def __call__(self, scope, receive, send) -> None:
        request = Request(scope)
        name = request.path_params.get("episode") or request.headers.get(EPISODE_HEADER)
        try:
            if not name:
                raise EpisodeNotOpen("name the episode: /episodes/<name>/mcp, or the X-Gymfoundry-Episode header")
            self.hub.authorize(name, bearer(request))
        except (EpisodeNotOpen, WrongToken) as exc:
            await refused(exc)(scope, receive, send)
            return
        if request.method == "DELETE":  # ended before the client hears it is closed
            await anyio.to_thread.run_sync(self.hub.finish, name)
        await self.app(scope, receive, send)


def build_app(hub: EpisodeHub, host: str = "127.0.0.1"):
    """The streamable-HTTP app: `POST /episodes/<name>/open` (201 and the episode's token, shown
    once), `/mcp` and `/episodes/<name>/mcp`, and `POST /episodes/<name>/finish` (the episode's
    rollout and task ids as JSON; never its class: a verdict shown to the harness would let it probe
    a task in one episode and play it again, knowing, in another). The reply to finish comes once the
    episode is durable (spooled), so a rollout id the harness was given is never lost."""
    server = build_server(hub)
    app = server.streamable_http_app(host=host, session_idle_timeout=None)
    endpoint = _Episodes(hub, StreamableHTTPASGIApp(server.session_manager))

    async def open_episode(request: Request) -> JSONResponse:
        name = request.path_params["episode"]
        if not EPISODE_NAME.fullmatch(name):
            return JSONResponse({"error": "bad episode name"}, status_code=404)
        try:
            token = await anyio.to_thread.run_sync(hub.open, name)
        except EpisodeExists as exc:
            return JSONResponse({"error": str(exc)}, status_code=409)
        except TooManyEpisodes as exc:
            return JSONResponse({"error": str(exc)}, status_code=429)
        return JSONResponse({"episode": name, "token": token}, status_code=201)

    async def finish(request: Request) -> JSONResponse:
        name = request.path_params["episode"]
        try:
            hub.authorize(name, bearer(request))
        except (EpisodeNotOpen, WrongToken) as exc:
            return refused(exc)
        try:
            await anyio.to_thread.run_sync(hub.finish, name)
        except Exception as exc:  # the hub fails an episode alone; anything else is said, never a bare 500
            log.exception("finishing harness episode %s failed", name)
            return JSONResponse({"error": f"finishing the episode failed: {type(exc).__name__}"}, status_code=503)
        return JSONResponse(hub.reply(name))

    app.router.routes[:] = [Route("/mcp", endpoint=endpoint), Route("/episodes/{episode}/mcp", endpoint=endpoint),
                            Route("/episodes/{episode}/open", endpoint=open_episode, methods=["POST"]),
                            Route("/episodes/{episode}/finish", endpoint=finish, methods=["POST"])]
    return app


async def serve_stdio(hub: EpisodeHub, episode: str) -> None:
    """One episode (opened by the caller) over stdin/stdout; it ends (and lands) when the client closes
    the connection."""
    from mcp.server.stdio import stdio_server

    server = build_server(hub, stdio_episode=episode)
    try:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        if hub.played(episode):
            await anyio.to_thread.run_sync(hub.finish, episode)
        else:  # a connection that never asked for anything played no episode
            await anyio.to_thread.run_sync(hub.abandon, episode)
