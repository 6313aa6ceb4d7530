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

import contextlib
import io
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, TextIO

import numpy as np
import torch

from .camera import Camera, StartView, camera_from_view, fly, reset_view, turn
from .colormap import colorbar, describe_range, to_tensor_bg, visualize
from .controls import PageControls
from .network import CLOSE_GRACE_S, end_connections, pick_port, quiet_handshake_errors, url_of
from .optional_viser import require_viser

if TYPE_CHECKING:
    from ..model import GaussianModel
    from ..outputs import RasterOutput
    from ..trainer import Trainer

#: Seconds without a camera update after which a moving view is refined.
SETTLE_S = 0.25
#: Lowest resolution scale used while moving.
MIN_SCALE = 0.1


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
            self.ui = PageControls(self.server, start, near, far, background, radius)
            self._wire_controls()
        except BaseException:
            self.server.stop()  # no server left running behind a failed constructor
            raise
        self.port = int(self.server.get_port())  # viser moves on if ``chosen`` was taken meanwhile
        if port != 0 and self.port != port:
            print(f"port {port} is in use: using port {self.port}", file=log)
        self.url = url_of(host, self.port)
        self._thread = threading.Thread(target=self._loop, name="splat-viewer", daemon=True)
        self._thread.start()

    def _wire_controls(self) -> None:
        """The callbacks behind the page's controls."""
        ui = self.ui
        for h in (ui.mode, ui.cmap, ui.near, ui.far, ui.bg, ui.scale):
            h.on_update(lambda _: self.invalidate())
        for h in (ui.range_lo, ui.range_hi):  # written by the render loop itself in auto mode
            h.on_update(lambda _: None if ui.auto_range.value else self.invalidate())
        ui.cmap.on_update(lambda _: setattr(ui.bar, "image", colorbar(ui.cmap.value)))
        ui.auto_range.on_update(self._on_auto_range)
        ui.fly.on_click(lambda ev: fly(ev.client.camera, ev.target.value, float(ui.step_size.value)))
        ui.turn.on_click(lambda ev: turn(ev.client.camera, ev.target.value))
        ui.reset.on_click(lambda ev: reset_view(ev.client.camera, self.start))
        self.server.on_client_connect(self._on_connect)
        self.server.on_client_disconnect(self._on_disconnect)

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
        end_connections(self.server, CLOSE_GRACE_S)
        self.server.stop()

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
        self.ui.range_lo.disabled = self.ui.range_hi.disabled = bool(self.ui.auto_range.value)
        self.invalidate()

    # ------------------------------------------------------ rendering
    def _next_job(self):
        """(client id, scale) of the next frame to render, or None."""
        now = time.monotonic()
        full = float(self.ui.scale.value)
        for cid, st in self._states.items():
            moving = now - st.moved_at < SETTLE_S
            if st.dirty:
                scale = full
                if moving and self.ui.adaptive.value and self._cost_per_px is not None:
                    cam = self.server.get_clients().get(cid)
                    if cam is not None:
                        px = max(cam.camera.image_width * cam.camera.image_height, 1)
                        fit = math.sqrt(float(self.ui.budget.value) / 1000.0 / (self._cost_per_px * px))
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
                self.ui.stats.content = f"render failed: {type(e).__name__}: {e}"
                print(f"viewer: render failed: {type(e).__name__}: {e}", file=self._log)
                continue
            with self._wake:
                st = self._states.get(cid)
                if st is not None:
                    st.low_res = scale < float(self.ui.scale.value) - 1e-9
                    st.last = info

    def render(self, camera: Camera, model: Optional[GaussianModel] = None) -> RasterOutput:
        """The rasterizer output of the current model in ``camera`` (no gradients)."""
        from ..model_render import render_frame

        with self._model_lock:
            model = self._model if model is None else model
        bg = to_tensor_bg(c / 255.0 for c in self.ui.bg.value)
        near, far = float(self.ui.near.value), float(self.ui.far.value)
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
        mode, cmap = self.ui.mode.value, self.ui.cmap.value
        manual = None if self.ui.auto_range.value else (float(self.ui.range_lo.value), float(self.ui.range_hi.value))
        bg = [v / 255.0 for v in self.ui.bg.value]
        pic = visualize(out, mode, bg, cmap, manual)
        still = scale >= float(self.ui.scale.value) - 1e-9
        # Still frames lossless; moving ones as JPEG (smaller, faster to encode).
        client.scene.set_background_image(pic.image, format="png" if still else "jpeg", jpeg_quality=85)
        self.frames_rendered += 1
        self.ui.stats.content = (
            f"**{n:,} surfels** · render {seconds * 1000:.0f} ms at "
            f"{camera.width}×{camera.height} (scale {scale:.2f}) · backend {self.backend}"
        )
        self.ui.range_md.content = describe_range(mode, cmap, pic)
        self.ui.bar.visible = pic.lo is not None
        if pic.lo is not None and self.ui.auto_range.value:
            self.ui.range_lo.value, self.ui.range_hi.value = round(pic.lo, 4), round(pic.hi, 4)
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
        self.ui.training_md.visible = True
        self.ui.pause.visible = True
        self.ui.pause.on_click(lambda _: self.set_paused(not self._paused.is_set()))

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def set_paused(self, paused: bool) -> None:
        if paused:
            self._paused.set()
        else:
            self._paused.clear()
        self.ui.pause.label = "Resume training" if paused else "Pause training"

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
            self.ui.training_md.content = (
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
        self.ui.training_md.content = f"**training done** at step {step:,}"
        self.ui.pause.visible = False
