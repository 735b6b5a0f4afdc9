"""moto's S3 server (``python -m moto.server`` arguments) with ranged GETs that
cost the range, not the object.

moto 5.2.1 answers a ranged GET by copying the whole object out of its
buffer (a temporary file beyond 5 MiB) and slicing the range from the copy: a
GET of one 1.2 KB feature row of a 548 MB blob copies 548 MB, so a storage
benchmark at the seeds' scale measures moto, not the requests. Here objects
stay in memory (``MOTO_S3_DEFAULT_KEY_BUFFER_SIZE``, a moto setting, above
any blob) and the object's getter returns the buffer's bytes without copying
them (``BytesIO.getvalue`` shares them); moto's HTTP server, routing and
range handling are unchanged. Memory: the stored objects, once.

    python scripts/moto_ranged_server.py -H 127.0.0.1 -p 45123
"""

import io
import os
import sys

os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(16 << 30))

import moto.s3.models as models  # noqa: E402
from moto.server import main  # noqa: E402

_set_value = models.FakeKey.value.fset


def _value(self) -> bytes:
    with self.lock:
        buf = getattr(self._value_buffer, "_file", None)
        if isinstance(buf, io.BytesIO):
            return buf.getvalue()  # shares the buffer's bytes: no copy
        self._value_buffer.seek(0)
        return self._value_buffer.read()


models.FakeKey.value = property(_value, _set_value)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
