"""Recordings (`ustack record`, `report`, `archive`): the format, the
writer a run streams into, the reader that replays a recording as a
capture, and the archive of the binaries a recording names."""
