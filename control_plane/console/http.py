"""The operator console's HTTP server, on the control plane's own event loop (aiohttp).

- `/`, `/queue`, `/tasks`, `/tasks/<id>`, `/hosts/<id>`: one page (static/index.html,
  given the task statuses it needs: STATUSES) whose script draws the view the path names.
- `POST /api/amc.v1.Scheduler/<Method>` (and `/api/amc.v1.Admin/<Method>` for the Farm
  and Host pages: GetHost, for its operator events, and CordonHost, UncordonHost,
  DrainHost, CordonDevice, UncordonDevice and ReleaseDevice, for their buttons; and
  ListFairShares and SetFairShare, for the Queue page's fairness keys; and
  `/api/amc.v1.Library/<Method>` for the Apps page): the JSON mapping of the services. The
  body is the request message in proto JSON; the call goes to the very servicer method the
  gRPC server calls (`@rpc`: the same authentication, roles, validation and error
  messages); the answer is the response message in proto JSON, with `<field>_text` beside
  each DeviceSelector (the control plane's text of it: the page formats no selector), or
  `{"code", "message"}` with the HTTP status of the gRPC code.
- `GET /api/artifacts/<task_id>/<artifact_id>`: one artifact's bytes, through the servicer's
  own GetArtifact, its SHA-256 checked as it is sent (control_plane.console.artifacts).
- `POST /api/library/apps` (and `/files`): the Apps page's upload, the file's bytes as the
  body, streamed into the servicer's own UploadApp (control_plane.console.library).
- `GET /api/control?host_id=H&serial=S`: a WebSocket driving one idle phone in an
  interactive session, for operators (control_plane.console.control); `/control` its page.
- `GET /api/screen?host_id=H&serial=S` or `?task_id=T`: a WebSocket of a phone's live
  screen, one binary message per frame (control_plane.console.screen: the layout).
- `GET /api/thumbnails`: one WebSocket of many phones' thumbnails, a frame every few
  seconds each, for the Farm and Host pages (control_plane.console.thumbnails).
- `GET /api/logs/<task_id>`: a task's phone log as JSON lines (control_plane.console.logs).
- `GET /api/events`: server-sent events from the replica's notification hub (task
  changed, host freed, work queued), coalesced per browser; pages re-read what changed
  (control_plane.console.events).
- `/favicon.ico`: the console's icon (static/favicon.ico).
- `/session`, `/wd/hub/session` and what is under them, `/status`: the WebDriver endpoint
  (control_plane.console.webdriver).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import grpc
import structlog
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from amc_common.device_selector import describe
from control_plane import errors
from control_plane.admin_service import AdminService
from control_plane.auth import Authenticator, authorize
from control_plane.console import artifacts, library, logs, screen, thumbnails
from control_plane.console.calls import (
    CallContext,
    Refused,
    foreign_origin,
    socket_authorization,
)
from control_plane.console.control import Controls
from control_plane.console.events import Events
from control_plane.console.webdriver import WebDriver
from control_plane.domain import Role
from control_plane.hub import Hub
from control_plane.library_service import LibraryService
from control_plane.lifecycle import IN_FLIGHT, TERMINAL, TaskStatus
from control_plane.rpc import code_for
from control_plane.scheduler_service import SchedulerService

log = structlog.get_logger(__name__)

SCHEDULER = SchedulerService.DESCRIPTOR
# The unary Scheduler methods a page may call (WatchTask's part is /api/events).
METHODS = frozenset(
    {
        "SubmitTask",
        "SubmitTasks",
        "GetTask",
        "ListTasks",
        "CancelTask",
        "ListHosts",
        "ListTaskEvents",
        "GetQueue",
    }
)
ADMIN = AdminService.DESCRIPTOR
# The Admin methods a page may call: the Host page's read, the Farm and Host pages'
# buttons (operator role, as over gRPC; each recorded as a host event with the caller and
# the reason), and the Queue page's fairness keys and their shares (recorded likewise).
ADMIN_METHODS = frozenset(
    {
        "GetHost",
        "CordonHost",
        "UncordonHost",
        "DrainHost",
        "CordonDevice",
        "UncordonDevice",
        "ReleaseDevice",
        "ListFairShares",
        "SetFairShare",
    }
)
LIBRARY = LibraryService.DESCRIPTOR
# The Library methods the Apps page calls (its upload is /api/library/<what>).
LIBRARY_METHODS = frozenset({"ListApps", "GetApp", "DeleteApp", "ListFiles", "DeleteFile"})
PAGES = (
    "/", "/farm", "/queue", "/tasks", "/tasks/{task_id}", "/hosts/{host_id}", "/control", "/apps",
)  # fmt: skip
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 413,
    grpc.StatusCode.DATA_LOSS: 422,
}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
# Screenshots and recordings are fetched with the token and shown from blob: URLs.
BLOBS = "img-src 'self' blob:; media-src 'self' blob:;"
SECURITY_HEADERS = {
    "Content-Security-Policy": f"default-src 'self'; {BLOBS} frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# What the page's script knows of the task state machine (the statuses in order, which end
# a task, which run one), from lifecycle rather than declared again in the script: filled
# into index.html's `statuses` block (a JSON data block, which the CSP does not run).
STATUSES_SLOT = '<script type="application/json" id="statuses"></script>'
STATUSES = json.dumps(
    {
        "statuses": list(TaskStatus),
        "terminal": [s for s in TaskStatus if s in TERMINAL],
        "in_flight": [s for s in TaskStatus if s in IN_FLIGHT],
    }
)
SELECTOR = "amc.v1.DeviceSelector"
# What static/ serves, by the file's extension.
ASSET_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".ico": "image/vnd.microsoft.icon",
}


def _refusal(code: grpc.StatusCode, message: str) -> web.Response:
    return web.json_response(
        {"code": code.name, "message": message}, status=HTTP_STATUS.get(code, 500)
    )


class Console:
    def __init__(
        self,
        scheduler: SchedulerService,
        auth: Authenticator,
        hub: Hub,
        admin: AdminService | None = None,
        library: LibraryService | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.library = library
        # The services the pages call, by name: their servicer and the methods mapped.
        self._services = {
            SCHEDULER.full_name: (scheduler, METHODS),
            ADMIN.full_name: (admin, ADMIN_METHODS),
            LIBRARY.full_name: (library, LIBRARY_METHODS),
        }
        self.auth = auth
        self.hub = hub
        self.static = resources.files(__package__).joinpath("static")
        self._runner: web.AppRunner | None = None
        self._events = Events(hub)
        self.controls = Controls(scheduler, auth)
        self.webdriver = WebDriver(scheduler, auth)
        self.origins = scheduler.settings.console_origins
        self.port = 0

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        for path in PAGES:
            app.router.add_get(path, self.page)
        app.router.add_get("/static/{name}", self.asset)
        app.router.add_get("/favicon.ico", self.favicon)
        app.router.add_post("/api/library/{what}", self.upload)
        app.router.add_post("/api/{service}/{method}", self.call)
        app.router.add_get("/api/artifacts/{task_id}/{artifact_id}", self.artifact)
        app.router.add_get("/api/events", self.events)
        app.router.add_get("/api/screen", self.screen)
        app.router.add_get("/api/thumbnails", self.thumbnails)
        app.router.add_get("/api/logs/{task_id}", logs.route(self.scheduler, _refusal))
        app.router.add_get("/api/control", self.control)
        self.webdriver.add_routes(app)
        return app

    async def start(self, listen: str, ssl_context: ssl.SSLContext | None = None) -> int:
        host, _, port = listen.rpartition(":")
        runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await runner.setup()
        address = host.strip("[]") or "127.0.0.1"
        site = web.TCPSite(runner, address, int(port), ssl_context=ssl_context)
        await site.start()
        self._runner = runner
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else int(port)
        return self.port

    async def stop(self) -> None:
        """After the hub closed: event streams end, then the server."""
        self._events.close()
        await self.webdriver.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- the border ------------------------------------------------------------------------

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        # Without authentication the console is open on loopback only; a page of another
        # site must not reach it through a name that resolves to 127.0.0.1 either.
        if not self.auth.enabled and request.url.host not in LOOPBACK_HOSTS:
            return _refusal(grpc.StatusCode.PERMISSION_DENIED, "open on loopback names only")
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status >= 400:
                return _refusal(grpc.StatusCode.NOT_FOUND, f"nothing at {request.path}")
            raise
        except Exception:
            log.exception("console request failed", path=request.path)
            return _refusal(grpc.StatusCode.INTERNAL, "internal error")
        response.headers.update(SECURITY_HEADERS)
        return response

    # -- pages -----------------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.StreamResponse:
        html = self.static.joinpath("index.html").read_text("utf-8")
        filled = STATUSES_SLOT.replace("></", f">{STATUSES}</")
        return web.Response(
            text=html.replace(STATUSES_SLOT, filled),
            content_type="text/html",
            charset="utf-8",
            headers={"Cache-Control": "no-cache"},
        )

    async def asset(self, request: web.Request) -> web.StreamResponse:
        return await self._file(request.match_info["name"])

    async def favicon(self, request: web.Request) -> web.StreamResponse:
        return await self._file("favicon.ico")

    async def _file(self, name: str) -> web.StreamResponse:
        kind = next((t for ext, t in ASSET_TYPES.items() if name.endswith(ext)), None)
        item = self.static.joinpath(name)
        if kind is None or "/" in name or not item.is_file():
            raise web.HTTPNotFound()
        return web.Response(
            body=item.read_bytes(),
            content_type=kind,
            charset="utf-8" if kind.startswith("text/") else None,
            headers={"Cache-Control": "no-cache"},
        )

    # -- the API ---------------------------------------------------------------------------

    async def call(self, request: web.Request) -> web.Response:
        name = request.match_info["method"]
        servicer, methods = self._services.get(request.match_info["service"], (None, ()))
        if name not in methods or servicer is None:
            return _refusal(grpc.StatusCode.NOT_FOUND, f"no method {name} here")
        return await self._call(request, servicer, servicer.DESCRIPTOR.methods_by_name[name])

    async def upload(self, request: web.Request) -> web.Response:
        """An app or a file for the library (control_plane.console.library)."""
        if self.library is None:
            return _refusal(grpc.StatusCode.NOT_FOUND, f"nothing at {request.path}")
        return await library.upload(self.library, request, _refusal, _to_json)

    async def _call(self, request: web.Request, servicer: Any, method: Any) -> web.Response:
        name = method.name
        # A JSON content type cannot be sent across sites without the browser asking first
        # (and this server never says yes): no other page can act with this one's access.
        if request.content_type != "application/json":
            return _refusal(grpc.StatusCode.INVALID_ARGUMENT, "send application/json")
        request_class = GetMessageClass(method.input_type)
        try:
            message = json_format.Parse(await request.text() or "{}", request_class())
        except (json_format.ParseError, UnicodeDecodeError) as exc:
            return _refusal(grpc.StatusCode.INVALID_ARGUMENT, f"request: {exc}")
        context = CallContext(request.headers.get("Authorization"))
        try:
            answer = await getattr(servicer, name)(message, context)
        except Refused as exc:
            return _refusal(exc.code, exc.message)
        return web.json_response(_selector_texts(answer, _to_json(answer)))

    async def artifact(self, request: web.Request) -> web.StreamResponse:
        """A kept file's bytes (control_plane.console.artifacts)."""
        return await artifacts.serve(self.scheduler, request, _refusal, SECURITY_HEADERS)

    async def control(self, request: web.Request) -> web.StreamResponse:
        """A refusal before the socket opens is answered like the API's."""
        if (origin := foreign_origin(request, self.origins)) is not None:
            return _refusal(grpc.StatusCode.PERMISSION_DENIED, f"not from this console: {origin}")
        context = CallContext(socket_authorization(request))
        try:
            return await self.controls.serve(request, context)
        except errors.AmcError as exc:
            return _refusal(code_for(exc), exc.message)

    async def screen(self, request: web.Request) -> web.StreamResponse:
        """A phone's live screen (control_plane.console.screen has the message layout)."""
        if (origin := foreign_origin(request, self.origins)) is not None:
            return _refusal(grpc.StatusCode.PERMISSION_DENIED, f"not from this console: {origin}")
        return await screen.serve(self.scheduler, request, _refusal)

    async def thumbnails(self, request: web.Request) -> web.StreamResponse:
        """Many phones' thumbnails (control_plane.console.thumbnails)."""
        if (origin := foreign_origin(request, self.origins)) is not None:
            return _refusal(grpc.StatusCode.PERMISSION_DENIED, f"not from this console: {origin}")
        return await thumbnails.serve(self.scheduler, self.auth, request, _refusal)

    async def events(self, request: web.Request) -> web.StreamResponse:
        caller = CallContext(request.headers.get("Authorization"))
        try:
            who = await self.auth.principal(caller.invocation_metadata())
            authorize(who, f"/{SCHEDULER.full_name}/WatchTask")
        except errors.AmcError as exc:
            return _refusal(code_for(exc), exc.message)
        # Host ids are for those who may see the farm.
        hosts = who.role in (None, Role.OPERATOR)
        return await self._events.serve(request, hosts=hosts, headers=SECURITY_HEADERS)


def _selector_texts(message: Message, document: dict[str, Any]) -> dict[str, Any]:
    """The answer with `<field>_text` beside each DeviceSelector field of its messages
    (`selector_text` of a task, of a queue group): the selector's one text
    (amc_common.device_selector: `model=Pixel9,rack=r1`, `serial=X`, `any device`, as in a
    pending reason), so the page does not format selectors itself. The console's JSON
    only; the API's messages are unchanged."""
    if not isinstance(document, dict):  # a well-known type written as a string or list
        return document
    for field in message.DESCRIPTOR.fields:
        kind = field.message_type
        if kind is None or kind.GetOptions().map_entry:
            continue
        value = getattr(message, field.name)
        if kind.full_name == SELECTOR and not field.is_repeated:
            document[f"{field.name}_text"] = describe(value.serial or None, dict(value.labels))
        elif field.name not in document:
            continue
        elif field.is_repeated:
            for item, part in zip(value, document[field.name], strict=True):
                _selector_texts(item, part)
        else:
            _selector_texts(value, document[field.name])
    return document


def _to_json(message: Message) -> dict[str, Any]:
    document: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return document
