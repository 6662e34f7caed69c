"""The HTTP side of an answer: what a route's values become on the wire (render.py)."""
