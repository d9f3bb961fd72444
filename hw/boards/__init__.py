"""Board wrappers of the core and their builds: ECP5 boards with the open toolchain (:mod:`hw.boards.ecp5`,
host link :mod:`hw.boards.uart_link`) and the generated Xilinx flows (``hw.boards.xilinx``).

``python -m hw.boards BOARD`` (``make bitstream BOARD=...``) builds one board (:mod:`hw.boards.__main__`).
"""
