"""The page at ``GET /``: the served models and their versions with eval metrics, the live
server metrics, and a form to try a task. Plain HTML and a little JavaScript in
``static/index.html`` (no build step), read once at import; it calls the same JSON API."""

from __future__ import annotations

from importlib.resources import files

PAGE = files("shoestring.serve").joinpath("static/index.html").read_text(encoding="utf-8")
