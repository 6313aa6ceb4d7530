"""Drop-in interfaces of other rasterizers, computing splat's definitions.

Each submodule speaks one peer's interface, units and layouts and lists in
its docstring where splat's maths differs from that peer's.  See
docs/porting.md.
"""
