"""The viewer page's controls: the panel beside the picture and the browser
camera's start.  The server (splat/viewer/server.py) reads their values and
wires their callbacks; here they are only laid out."""

from __future__ import annotations

from typing import Any, Sequence

from .camera import StartView
from .colormap import COLORMAPS, MODES, colorbar


class PageControls:
    """The handles of every control on a viser server's page.

    ``start``: where browsers' cameras start; ``near`` / ``far`` / ``background``
    the initial render settings; ``radius`` the scene's size (sets the fly step)."""

    def __init__(
        self, server: Any, start: StartView, near: float, far: float, background: Sequence[float], radius: float
    ):
        server.gui.configure_theme(show_logo=False, show_share_button=False)
        server.gui.main_panel.dock_right()  # the panel beside the picture, not over it
        server.scene.set_up_direction(tuple(start.up))
        cam = server.initial_camera
        cam.fov = float(start.fov_y)
        cam.position = tuple(start.position)
        cam.look_at = tuple(start.look_at)
        cam.up = tuple(start.up)

        g = server.gui
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
