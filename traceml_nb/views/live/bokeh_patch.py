"""A ``BokehModel`` that sends many document changes as one message, with its arrays inline.

``jupyter_bokeh.BokehModel`` sends each document change as its own ``PATCH-DOC`` message, and
each array of it as two more comm messages; a live chart that updates several sources a tick
would send dozens. :class:`BatchedBokehModel` holds the changes of a block and sends them as
one message of three comm messages, in the format ``BokehModel`` itself uses.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bokeh.models import LayoutDOM
from bokeh.protocol import Protocol
from jupyter_bokeh import BokehModel


class BatchedBokehModel(BokehModel):
    """A ``BokehModel`` that can send many document changes as one ``PATCH-DOC`` message.

    Inside :meth:`batch` the changes are held and sent together when the block ends, in the
    same wire format as ``BokehModel`` uses for a single change. ``sent_messages`` counts the
    comm messages this widget sent.
    """

    def __init__(self, model: LayoutDOM, **kwargs: Any) -> None:
        self._held: list[Any] | None = None
        self.sent_messages = 0
        super().__init__(model, **kwargs)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Hold the document changes made in the block and send them as one message."""
        self._held = []
        try:
            yield
        finally:
            events, self._held = self._held, None
            if events:
                self._send_patch(events)

    def _document_patched(self, event: Any) -> None:
        if event.setter is self:
            return
        if self._held is not None:
            self._held.append(event)
        else:
            self._send_patch([event])

    def _send_patch(self, events: list[Any]) -> None:
        msg = patch_message(events)
        self.send({"msg": "patch", "payload": msg.header_json})
        self.send({"msg": "patch", "payload": msg.metadata_json})
        self.send({"msg": "patch", "payload": msg.content_json})
        for buffer in msg.buffers:
            self.send({"msg": "patch", "payload": json.dumps(buffer.ref)})
            self.send({"msg": "patch"}, [buffer.to_bytes()])

    def send(self, content: Any, buffers: Any = None) -> None:
        self.sent_messages += 1
        super().send(content, buffers)

    def close(self) -> None:
        """Close the comm and detach from the document; unlike ``BokehModel``'s, safe twice."""
        if getattr(self, "_detached", False) or not hasattr(self, "_model"):
            return  # closed already, or never built (ipywidgets calls close() from __del__)
        self._detached = True
        super().close()


#: gzip level of the arrays sent inline: 0, stored. BokehJS gunzips every inline array, so it
#: must be gzip; but chart columns of float32 barely compress, and deflating them costs many
#: times what storing them does at any level (benchmarks/README.md, the live view's cost).
#: Bokeh's own level (``bokeh.settings.compression_level``) is the user's setting: left alone.
INLINE_GZIP_LEVEL = 0


try:
    from bokeh.core.serialization import BytesRep, Serializer

    class _InlineSerializer(Serializer):
        """Bokeh's ``Serializer`` with arrays inline, gzip-compressed at
        :data:`INLINE_GZIP_LEVEL`."""

        def _encode_bytes(self, obj: Any) -> Any:
            packed = gzip.compress(bytes(obj), compresslevel=INLINE_GZIP_LEVEL, mtime=1)
            return BytesRep(type="bytes", data=base64.b64encode(packed).decode("ascii"))

except ImportError:  # Bokeh's internals differ: patch_message falls back
    _InlineSerializer = None  # type: ignore[assignment,misc]


def patch_message(events: list[Any]) -> Any:
    """A Bokeh ``PATCH-DOC`` message for ``events`` with its arrays inline (base64).

    ``Protocol().create`` puts every array in a separate binary buffer, which ``BokehModel``
    sends as two more comm messages each; inline, a tick is three messages however many
    columns it updates. Falls back to ``Protocol().create`` if Bokeh's internals differ.
    """
    try:
        from bokeh.document.json import PatchJson
        from bokeh.protocol.messages.patch_doc import patch_doc

        doc = events[0].document
        references = doc.models.synced_references
    except (ImportError, AttributeError):
        references = None
    if references is None or _InlineSerializer is None:
        return Protocol().create("PATCH-DOC", events)
    serializer = _InlineSerializer(references=references, deferred=False)
    content = PatchJson(events=serializer.encode(events))
    doc.models.flush_synced(lambda model: not serializer.has_ref(model))
    return patch_doc(patch_doc.create_header(), {}, content)
