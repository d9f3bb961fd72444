"""Amaranth 0.5 gateware of the mmfree-fpga accelerator (DESIGN.md section 3).

One component per module: the ternary GEMV engine, the weight-channel decoders, the epilogue unit, the
reduction and quantize unit, the sequencer, the AXI4-Lite register block and the top ``Accelerator``.
``hw.isa`` (the image format, instruction layouts, opcodes, packings and register map) is the one
definition of the bits that ``host`` imports too.
"""
