"""A minimal onnxruntime runtime for MLServer, written for the benchmark (MLServer has none).

`load` opens one InferenceSession on `parameters.uri`; `predict` decodes the first input with
NumpyCodec, runs the session and encodes every output. Thread count: `parameters.extra.threads`.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxRuntimeModel(MLModel):
    async def load(self) -> bool:
        path = await get_model_uri(self.settings)
        extra = (self.settings.parameters.extra if self.settings.parameters else None) or {}
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(extra.get("threads", 1))
        so.inter_op_num_threads = 1
        self._sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self._in = self._sess.get_inputs()[0].name
        self._outs = [o.name for o in self._sess.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        ys = self._sess.run(self._outs, {self._in: x})
        return InferenceResponse(
            model_name=self.name, model_version=self.version, id=payload.id,
            outputs=[NumpyCodec.encode_output(n, y) for n, y in zip(self._outs, ys, strict=True)],
        )
