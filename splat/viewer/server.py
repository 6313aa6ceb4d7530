"""The viewer page: a viser server whose picture is rendered by ``splat.rasterize``.

One render thread serves every connected browser.  A browser's camera
(orbit with the mouse: drag to orbit, right-drag to pan, wheel to zoom; or the
page's fly buttons) marks it dirty; the thread renders it with
:func:`splat.model_render.render_frame` (the public ``splat.rasterize``) and sends
the picture as the scene's background image, which the browser stretches over
its canvas.  While the camera moves, frames are rendered at a resolution
scale chosen from the measured cost per pixel so that one frame takes about
``moving budget`` ms; once the camera has been still for ``SETTLE_S`` the view
is refined at the full scale (lossless PNG).

``TrainingView`` adds what ``train.py --viewer`` needs: a per-step trainer
callback that publishes the current model (a detached copy, at most every
``refresh_s`` and only while a browser is connected), steps per second and
the loss, and blocks while the page's pause button is down.  With no browser
connected the callback only stores a few numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import logging
import math
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, TextIO

import numpy as np
import torch

from ..errors import SplatInputError
from .camera import Camera, StartView, camera_from_view, quat_to_matrix
from .colormap import COLORMAPS, MODES, colorbar, describe_range, to_tensor_bg, visualize
from .optional_viser import require_viser

if TYPE_CHECKING:
    from ..model import GaussianModel
    from ..outputs import RasterOutput
    from ..trainer import Trainer

#: Seconds without a camera update after which a moving view is refined.
SETTLE_S = 0.25
#: Lowest resolution scale used while moving.
MIN_SCALE = 0.1
#: Seconds websocket clients get for the closing handshake when the server
#: stops, before their connections are aborted (see ViewerServer._end_connections).
CLOSE_GRACE_S = 0.5


def check_port(port: int) -> int:
    """``port`` if it is a TCP port number (0..65535; 0: any free port), else SplatInputError."""
    if not 0 <= int(port) <= 65535:
        raise SplatInputError(f"port {port}: must be 0..65535 (0: any free port)")
    return int(port)


def pick_port(host: str, port: int) -> int:
    """``port`` if it can be bound on ``host``, else a free port chosen by the OS.

    Only a hint: another process may take the port before the server binds it
    (viser then tries the next ones), so use the server's own port afterwards."""
    check_port(port)
    last = None
    for candidate in (port, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, candidate))
            except OSError as e:
                last = e
                continue
            return int(s.getsockname()[1])
    raise SplatInputError(f"cannot serve on {host}: {last.strerror or last}")


class _NoHandshakeErrors(logging.Filter):
    """Drops websockets' "opening handshake failed" error, a traceback on
    stderr for every connection that closes before sending a whole HTTP
    request (a browser's unused pre-connected socket, a port check): the
    client's doing, nothing for the viewer's user to act on.  viser adds the
    same filter itself, but only once a first page request has arrived."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "opening handshake failed"


def quiet_handshake_errors() -> None:
    """Install :class:`_NoHandshakeErrors` on websockets' server logger (once)."""
    log = logging.getLogger("websockets.server")
    if not any(isinstance(f, _NoHandshakeErrors) for f in log.filters):
        log.addFilter(_NoHandshakeErrors())


def url_of(host: str, port: int) -> str:
    shown = "localhost" if host in ("127.0.0.1", "0.0.0.0", "localhost", "") else host
    return f"http://{shown}:{port}"


@dataclass
class _ClientState:
    moved_at: float = 0.0  # monotonic time of the last camera update
    dirty: bool = True  # needs a new frame
    low_res: bool = False  # the last frame was rendered below the full scale
    last: Dict = field(default_factory=dict)  # info of the last frame


class ViewerServer:
    """Serve ``model`` (a :class:`splat.model.GaussianModel`) on ``http://host:port``.

    ``start``: where browsers' cameras start (and "Reset view" returns).
    ``port``: if it is taken, a free one is chosen and printed; :attr:`url`
    is the address actually served."""

    def __init__(
        self,
        model: GaussianModel,
        start: StartView,
        *,
        backend: str = "auto",
        near: float = 0.2,
        far: float = 100.0,
        background: Sequence[float] = (1.0, 1.0, 1.0),
        host: str = "127.0.0.1",
        port: int = 8080,
        title: str = "splat",
        scene_radius: Optional[float] = None,
        log: TextIO = sys.stderr,
    ):
        viser = require_viser()
        self.backend = backend
        self.start = start
        self._log = log
        self._model = model
        self._model_lock = threading.Lock()
        self._wake = threading.Condition()
        self._states: Dict[int, _ClientState] = {}
        self._stopped = False
        self._cost_per_px = None  # seconds per rendered pixel (EMA)
        self.frames_rendered = 0
        radius = scene_radius or float(np.linalg.norm(start.look_at - start.position)) or 1.0

        chosen = pick_port(host, port)
        quiet_handshake_errors()
        with contextlib.redirect_stdout(io.StringIO()):  # viser prints its own address box; we print one line
            self.server = viser.ViserServer(host=host, port=chosen, label=title, verbose=False)
        try:
            self._build_page(start, near, far, background, radius)
        except BaseException:
            self.server.stop()  # no server left running behind a failed constructor
            raise
        self.port = int(self.server.get_port())  # viser moves on if ``chosen`` was taken meanwhile
        if port != 0 and self.port != port:
            print(f"port {port} is in use: using port {self.port}", file=log)
        self.url = url_of(host, self.port)
        self._thread = threading.Thread(target=self._loop, name="splat-viewer", daemon=True)
        self._thread.start()

    def _build_page(self, start: StartView, near: float, far: float, background, radius: float) -> None:
        """The page's controls and the callbacks behind them."""
        s = self.server
        s.gui.configure_theme(show_logo=False, show_share_button=False)
        s.gui.main_panel.dock_right()  # the panel beside the picture, not over it
        s.scene.set_up_direction(tuple(start.up))
        cam = s.initial_camera
        cam.fov = float(start.fov_y)
        cam.position = tuple(start.position)
        cam.look_at = tuple(start.look_at)
        cam.up = tuple(start.up)

        g = s.gui
        self.stats = g.add_markdown("")
        self.training_md = g.add_markdown("", visible=False)
        self.pause = g.add_button("Pause training", visible=False)
        with g.add_folder("Render"):
            self.mode = g.add_dropdown("Mode", tuple(MODES), initial_value="RGB")
            self.cmap = g.add_dropdown("Colour map", COLORMAPS, initial_value="turbo")
            self.auto_range = g.add_checkbox("Auto range", True, hint="2nd..98th percentile of the view")
            self.range_lo = g.add_number("Range min", 0.0, step=0.01, disabled=True)
            self.range_hi = g.add_number("Range max", 1.0, step=0.01, disabled=True)
            self.range_md = g.add_markdown("RGB over the background")
            self.bar = g.add_image(colorbar("turbo"), label=None, format="png", visible=False)
            self.near = g.add_number("Near", float(near), min=1e-6, step=0.01)
            self.far = g.add_number("Far", float(far), min=1e-6, step=1.0)
            self.bg = g.add_rgb("Background", tuple(int(round(255 * c)) for c in background))
            self.scale = g.add_slider(
                "Resolution", 0.1, 1.0, 0.05, 1.0, hint="render scale of the canvas size when the camera is still"
            )
            self.adaptive = g.add_checkbox("Lower while moving", True)
            self.budget = g.add_slider("Moving budget (ms)", 20, 500, 10, 100)
        with g.add_folder("Camera"):
            g.add_markdown("Mouse: drag to orbit, right-drag to pan, wheel to zoom.")
            self.step_size = g.add_slider("Fly step", 0.01, 1.0, 0.01, round(min(max(0.1 * radius, 0.01), 1.0), 2))
            self.fly = g.add_button_group("Fly", ("Forward", "Back", "Left", "Right", "Up", "Down"))
            self.turn = g.add_button_group("Turn", ("Yaw L", "Yaw R", "Pitch U", "Pitch D"))
            self.reset = g.add_button("Reset view")

        for h in (self.mode, self.cmap, self.near, self.far, self.bg, self.scale):
            h.on_update(lambda _: self.invalidate())
        for h in (self.range_lo, self.range_hi):  # written by the render loop itself in auto mode
            h.on_update(lambda _: None if self.auto_range.value else self.invalidate())
        self.cmap.on_update(lambda _: setattr(self.bar, "image", colorbar(self.cmap.value)))
        self.auto_range.on_update(self._on_auto_range)
        self.fly.on_click(lambda ev: self._fly(ev.client, ev.target.value))
        self.turn.on_click(lambda ev: self._turn(ev.client, ev.target.value))
        self.reset.on_click(lambda ev: self._reset(ev.client))
        s.on_client_connect(self._on_connect)
        s.on_client_disconnect(self._on_disconnect)

    # ------------------------------------------------------------ state
    @property
    def num_clients(self) -> int:
        return len(self._states)

    def set_model(self, model: GaussianModel) -> None:
        """Show ``model`` from now on (thread-safe; the caller must not modify it afterwards)."""
        with self._model_lock:
            self._model = model
        self.invalidate()

    def invalidate(self) -> None:
        """Every browser needs a new frame."""
        with self._wake:
            for st in self._states.values():
                st.dirty = True
            self._wake.notify_all()

    def close(self) -> None:
        """Stop rendering and serving; returns within about :data:`CLOSE_GRACE_S`."""
        with self._wake:
            self._stopped = True
            self._wake.notify_all()
        self._thread.join(timeout=10)
        self._end_connections(CLOSE_GRACE_S)
        self.server.stop()

    def _end_connections(self, grace: float) -> None:
        """End the connections that are not websockets now, and every
        connection still open ``grace`` seconds from now.

        Stopping the websockets server waits for every connection handler to
        end, and a connection that never became a websocket -- a browser's
        idle keep-alive or pre-connected socket, any plain HTTP client -- ends
        only at websockets' 10 s ``open_timeout``; a websocket client that
        does not answer the closing handshake (a frozen tab, a bare socket)
        holds it for the 10 s ``close_timeout``.  viser's ``stop()`` gives its
        server thread 1 s + 5 s and then abandons it, so Ctrl+C would take 6-7 s
        and the process would exit with that thread still running ("Server
        stopped" never printed).  Here the handshake-stage handlers are
        cancelled (websockets' own path for a cancelled handshake: it aborts
        the connection, silently), and after ``grace`` -- the closing
        handshake of a live browser takes milliseconds -- the remaining
        connections are aborted, which ends their closing handshake and
        viser's handler (it runs its disconnect teardown), so the server
        thread finishes."""
        loop = getattr(getattr(self.server, "_websock_server", None), "_background_event_loop", None)
        if loop is None:  # another viser layout: its own stop() decides how long it takes
            return
        from websockets.protocol import State

        def connections():  # (handler task, connection) of every connection; on the server's loop
            for task in asyncio.all_tasks(loop):
                coro = task.get_coro()
                if getattr(coro, "__qualname__", "") == "Server.conn_handler":
                    yield task, inspect.getcoroutinelocals(coro).get("connection")

        def cancel_handshakes() -> None:
            for task, connection in connections():
                if getattr(getattr(connection, "protocol", None), "state", None) is not State.OPEN:
                    task.cancel()

        def abort_all() -> None:
            for task, connection in connections():
                transport = getattr(connection, "transport", None)
                if transport is not None:
                    transport.abort()
                else:
                    task.cancel()

        try:  # both run before the stop request that server.stop() queues after them
            loop.call_soon_threadsafe(cancel_handshakes)
            loop.call_soon_threadsafe(loop.call_later, grace, abort_all)
        except RuntimeError:  # the loop is closed already: nothing left to end
            pass

    def serve_until_interrupted(self) -> None:
        """Block until Ctrl+C (SIGINT) or SIGTERM; the caller closes the server.

        Both signals get Python's KeyboardInterrupt handler here, in the main
        thread: a process started with SIGINT ignored (a background job of a
        non-interactive shell, as some test and CI runners start commands)
        gets no KeyboardInterrupt handler from Python at all, and the viewer,
        whose only way to stop is a signal, would then ignore Ctrl+C and
        ``kill -INT`` for ever.  The previous handlers are restored on return."""
        previous = {}
        try:
            if threading.current_thread() is threading.main_thread():  # signal.signal works only there
                for sig in (signal.SIGINT, signal.SIGTERM):
                    previous[sig] = signal.signal(sig, signal.default_int_handler)
            while not self._stopped:
                time.sleep(0.5)  # a signal cuts it short
        except KeyboardInterrupt:
            pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def last_frame(self, client_id: Optional[int] = None) -> Dict:
        """Info on the last frame sent to a browser (camera, size, scale, ms, range); for tests and stats."""
        with self._wake:
            states = [self._states[client_id]] if client_id is not None else list(self._states.values())
            return dict(states[0].last) if states and states[0].last else {}

    # ------------------------------------------------------- callbacks
    def _on_connect(self, client) -> None:
        client.camera.on_update(lambda cam: self._on_camera(cam.client.client_id))
        with self._wake:
            self._states[client.client_id] = _ClientState(moved_at=time.monotonic())
            self._wake.notify_all()

    def _on_disconnect(self, client) -> None:
        with self._wake:
            self._states.pop(client.client_id, None)

    def _on_camera(self, client_id: int) -> None:
        with self._wake:
            st = self._states.get(client_id)
            if st is not None:
                st.moved_at = time.monotonic()
                st.dirty = True
                self._wake.notify_all()

    def _on_auto_range(self, _) -> None:
        self.range_lo.disabled = self.range_hi.disabled = bool(self.auto_range.value)
        self.invalidate()

    def _fly(self, client, direction: str) -> None:
        """Move the camera (and its orbit centre) one step along its own axes."""
        cam = client.camera
        R = quat_to_matrix(cam.wxyz)  # camera -> world: columns right, down, forward
        axis = {
            "Forward": R[:, 2],
            "Back": -R[:, 2],
            "Right": R[:, 0],
            "Left": -R[:, 0],
            "Down": R[:, 1],
            "Up": -R[:, 1],
        }[direction]
        cam.position = cam.position + float(self.step_size.value) * axis

    def _turn(self, client, direction: str) -> None:
        """Rotate the view 10 degrees about the camera centre (yaw about the up direction)."""
        cam = client.camera
        R = quat_to_matrix(cam.wxyz)
        angle = math.radians(10.0) * (1 if direction in ("Yaw R", "Pitch U") else -1)
        axis = cam.up_direction if direction.startswith("Yaw") else R[:, 0]
        axis = np.asarray(axis, dtype=np.float64) / max(np.linalg.norm(axis), 1e-12)
        if direction.startswith("Yaw"):
            axis = -axis  # a positive yaw turns to the right: about -up in OpenCV's frame
        offset = cam.look_at - cam.position
        c, s = math.cos(angle), math.sin(angle)
        rotated = offset * c + np.cross(axis, offset) * s + axis * (axis @ offset) * (1 - c)
        cam.look_at = cam.position + rotated

    def _reset(self, client) -> None:
        cam = client.camera
        cam.up_direction = tuple(self.start.up)
        cam.position = tuple(self.start.position)
        cam.look_at = tuple(self.start.look_at)
        cam.fov = float(self.start.fov_y)

    # ------------------------------------------------------ rendering
    def _next_job(self):
        """(client id, scale) of the next frame to render, or None."""
        now = time.monotonic()
        full = float(self.scale.value)
        for cid, st in self._states.items():
            moving = now - st.moved_at < SETTLE_S
            if st.dirty:
                scale = full
                if moving and self.adaptive.value and self._cost_per_px is not None:
                    cam = self.server.get_clients().get(cid)
                    if cam is not None:
                        px = max(cam.camera.image_width * cam.camera.image_height, 1)
                        fit = math.sqrt(float(self.budget.value) / 1000.0 / (self._cost_per_px * px))
                        scale = min(full, max(MIN_SCALE, fit))
                return cid, scale
            if st.low_res and not moving:
                return cid, full
        return None

    def _loop(self) -> None:
        while True:
            with self._wake:
                job = None
                while not self._stopped:
                    job = self._next_job()
                    if job is not None:
                        st = self._states[job[0]]
                        st.dirty = False
                        break
                    self._wake.wait(timeout=0.05)  # wakes on updates; the timeout catches settling
                if self._stopped:
                    return
            cid, scale = job
            client = self.server.get_clients().get(cid)
            if client is None:
                continue
            try:
                info = self._render_to(client, scale)
            except Exception as e:  # keep serving; show the problem on the page
                self.stats.content = f"render failed: {type(e).__name__}: {e}"
                print(f"viewer: render failed: {type(e).__name__}: {e}", file=self._log)
                continue
            with self._wake:
                st = self._states.get(cid)
                if st is not None:
                    st.low_res = scale < float(self.scale.value) - 1e-9
                    st.last = info

    def render(self, camera: Camera, model: Optional[GaussianModel] = None) -> RasterOutput:
        """The rasterizer output of the current model in ``camera`` (no gradients)."""
        from ..model_render import render_frame

        with self._model_lock:
            model = self._model if model is None else model
        bg = to_tensor_bg(c / 255.0 for c in self.bg.value)
        near, far = float(self.near.value), float(self.far.value)
        if not 0 < near < far:
            raise ValueError(f"near {near} and far {far}: need 0 < near < far")
        with torch.no_grad():
            out = render_frame(model, camera, bg, backend=self.backend, near=near, far=far)
        return out, model.num_gaussians

    def _render_to(self, client, scale: float) -> Dict:
        c = client.camera
        wxyz, position, fov = np.array(c.wxyz), np.array(c.position), float(c.fov)
        W, H = int(c.image_width), int(c.image_height)
        camera = camera_from_view(wxyz, position, fov, W, H, scale)
        t0 = time.perf_counter()
        out, n = self.render(camera)
        seconds = time.perf_counter() - t0
        px = camera.width * camera.height
        cost = seconds / px
        self._cost_per_px = cost if self._cost_per_px is None else 0.7 * self._cost_per_px + 0.3 * cost
        mode, cmap = self.mode.value, self.cmap.value
        manual = None if self.auto_range.value else (float(self.range_lo.value), float(self.range_hi.value))
        bg = [v / 255.0 for v in self.bg.value]
        pic = visualize(out, mode, bg, cmap, manual)
        still = scale >= float(self.scale.value) - 1e-9
        # Still frames lossless; moving ones as JPEG (smaller, faster to encode).
        client.scene.set_background_image(pic.image, format="png" if still else "jpeg", jpeg_quality=85)
        self.frames_rendered += 1
        self.stats.content = (
            f"**{n:,} surfels** · render {seconds * 1000:.0f} ms at "
            f"{camera.width}×{camera.height} (scale {scale:.2f}) · backend {self.backend}"
        )
        self.range_md.content = describe_range(mode, cmap, pic)
        self.bar.visible = pic.lo is not None
        if pic.lo is not None and self.auto_range.value:
            self.range_lo.value, self.range_hi.value = round(pic.lo, 4), round(pic.hi, 4)
        return {
            "wxyz": wxyz,
            "position": position,
            "fov": fov,
            "canvas": (W, H),
            "size": (camera.width, camera.height),
            "scale": scale,
            "ms": seconds * 1000,
            "mode": mode,
            "range": (pic.lo, pic.hi),
            "still": still,
            "time": time.monotonic(),
        }


class TrainingView(ViewerServer):
    """The viewer attached to a training run: pass :meth:`callback` to the Trainer."""

    def __init__(self, model: GaussianModel, start: StartView, *, refresh_s: float = 0.5, **kw: Any):
        super().__init__(model, start, **kw)
        self.refresh_s = float(refresh_s)
        self._paused = threading.Event()
        self._last_publish = 0.0
        self._last_text = 0.0
        self._rate_t0, self._rate_step0 = None, 0
        self.steps_per_s = 0.0
        self.training_md.visible = True
        self.pause.visible = True
        self.pause.on_click(lambda _: self.set_paused(not self._paused.is_set()))

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def set_paused(self, paused: bool) -> None:
        if paused:
            self._paused.set()
        else:
            self._paused.clear()
        self.pause.label = "Resume training" if paused else "Pause training"

    def callback(self, trainer: Trainer, step: int, terms: dict) -> None:
        """The trainer hook (``Trainer(callbacks=[view.callback])``)."""
        now = time.perf_counter()
        if self._rate_t0 is None or now - self._rate_t0 > 2.0:  # steps/s over the last ~2 s
            if self._rate_t0 is not None:
                self.steps_per_s = (step - self._rate_step0) / (now - self._rate_t0)
            self._rate_t0, self._rate_step0 = now, step
        if self._states:  # somebody is watching (idle otherwise: nothing more to do)
            self._publish(trainer, step, terms, now)
        if self._paused.is_set():  # blocking here pauses training (not counted in train_seconds)
            while self._paused.is_set() and not self._stopped:
                time.sleep(0.05)
            self._rate_t0 = None  # the pause is not part of the rate

    def _publish(self, trainer, step: int, terms: dict, now: float) -> None:
        if now - self._last_publish >= self.refresh_s:
            self._last_publish = now
            from ..model import GaussianModel

            self.set_model(GaussianModel(trainer.model.raw_state(), trainer.model.sh_degree))
        if now - self._last_text >= 0.25 or self.paused:
            self._last_text = now
            total = trainer.cfg["train"]["iterations"]
            self.training_md.content = (
                f"**training** step {step:,}/{total:,} · "
                f"{self.steps_per_s:.1f} steps/s · loss {terms.get('loss', float('nan')):.4f}"
                + (" · **paused**" if self.paused else "")
            )

    def _on_disconnect(self, client) -> None:
        super()._on_disconnect(client)
        if not self._states:
            self.set_paused(False)  # nobody left to press "Resume"

    def finished(self, step: int) -> None:
        """Training is over: say so on the page."""
        self.training_md.content = f"**training done** at step {step:,}"
        self.pause.visible = False
