"""GPTQ int4: checkpoint config and tensor format, the GPTQ/RTN quantizer, the int4 linear layer,
loading GPTQ checkpoints into models, and quantizing whole models."""

from .config import GPTQConfig
from .gptq import GPTQ, QuantizedWeight, gptq_quantize, quantize_rtn
from .gptq_format import (
    GPTQTensors,
    default_g_idx,
    dequantize_gptq,
    pack_gptq,
    pack_int4,
    pack_qweight,
    pack_qzeros,
    qzeros_v1_to_v2,
    qzeros_v2_to_v1,
    unpack_int4,
    unpack_qweight,
    unpack_qzeros,
)
from .int4_linear import GPTQLinear, KernelLayout, kernel_layout
from .loading import gptq_linear_factory, linear_factory_for
from .merged_linear import GPTQMergedLinear
from .quantize_model import QuantizeOptions, QuantizeResult, quantize_model

__all__ = [
    "GPTQ",
    "GPTQConfig",
    "GPTQLinear",
    "GPTQMergedLinear",
    "GPTQTensors",
    "KernelLayout",
    "QuantizeOptions",
    "QuantizeResult",
    "QuantizedWeight",
    "default_g_idx",
    "dequantize_gptq",
    "gptq_linear_factory",
    "gptq_quantize",
    "kernel_layout",
    "linear_factory_for",
    "pack_gptq",
    "pack_int4",
    "pack_qweight",
    "pack_qzeros",
    "qzeros_v1_to_v2",
    "qzeros_v2_to_v1",
    "quantize_model",
    "quantize_rtn",
    "unpack_int4",
    "unpack_qweight",
    "unpack_qzeros",
]
