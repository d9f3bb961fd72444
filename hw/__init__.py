"""Amaranth 0.5 gateware of the mmfree-fpga accelerator: a ternary GEMV datapath that runs one HGRN-Bit
token per pass over a streamed model image, each GEMV with an int8 quantize prologue and an epilogue
micro-op program for the element-wise work that follows it.

One component per module: the ternary GEMV engine, the weight-channel decoders, the epilogue unit, the
reduction and quantize unit, the sequencer, the AXI4-Lite register block and the top ``Accelerator``.
``hw.isa`` (the image format, instruction layouts, opcodes, packings and register map) is the one
definition of the bits that ``host`` imports too.
"""
