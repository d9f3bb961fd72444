"""A pure-Python stand-in for the part of Amaranth that :mod:`hw.isa` declares its bits with.

A board runs a compiled model bundle with the runtime's dependencies only (numpy, safetensors,
tokenizers, rich), without Amaranth. There :mod:`hw.isa` imports its ``Shape``, ``unsigned``,
``signed``, ``data`` and ``enum`` from here instead, so that the same class definitions execute and
``hw.isa`` stays the one definition of the bits. Where Amaranth is installed it is always used: the
gateware needs its real ``lib.data`` and ``lib.enum`` types as shapes.

Only what a layout *is* is modelled, with Amaranth 0.5's semantics: a :class:`Shape` (width,
signedness); enums and flags whose classes take ``shape=``; a :class:`StructLayout` whose fields lie
back to back in declaration order from bit 0 (as ``amaranth.lib.data.StructLayout`` places them);
an :class:`ArrayLayout`; a :class:`Struct` base whose annotations are its layout. Packing and
unpacking live in :mod:`hw.isa` (one implementation for both modes). ``tests/test_isa.py`` checks that
both modes give the same field offsets, widths, bytes and values for every layout.
"""

from __future__ import annotations

import enum as _py_enum
import inspect
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Shape", "unsigned", "signed", "data", "enum"]


@dataclass(frozen=True)
class Shape:
    """Width in bits and signedness of a value (``amaranth.hdl.Shape``)."""

    width: int = 1
    signed: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.width, int) or self.width < 0:
            raise TypeError(f"width must be a non-negative integer, not {self.width!r}")

    @staticmethod
    def cast(obj: Any) -> Shape:
        """The shape of ``obj``: a :class:`Shape`, a non-negative int (unsigned width), an enum class made
        with ``shape=``, a layout, or a :class:`Struct` class.

        Raises
        ------
        TypeError
            For anything else.
        """
        if isinstance(obj, Shape):
            return obj
        if isinstance(obj, int) and not isinstance(obj, bool) and obj >= 0:
            return Shape(obj, False)
        if isinstance(obj, type) and isinstance(getattr(obj, "_bits_shape", None), Shape):
            return obj._bits_shape
        if isinstance(obj, Layout) or (isinstance(obj, type) and issubclass(obj, Struct) and obj is not Struct):
            return Shape(Layout.cast(obj).size, False)
        raise TypeError(f"object {obj!r} cannot be converted to a shape")

    def __repr__(self) -> str:
        return f"{'signed' if self.signed else 'unsigned'}({self.width})"


def unsigned(width: int) -> Shape:
    """An unsigned shape of ``width`` bits."""
    return Shape(width, False)


def signed(width: int) -> Shape:
    """A signed (two's complement) shape of ``width`` bits."""
    return Shape(width, True)


# ---------------------------------------------------------------------------------------------- enums
class EnumType(_py_enum.EnumMeta):
    """Metaclass of :class:`Enum` and :class:`Flag`: accepts ``shape=`` and checks every member fits it."""

    def __new__(mcs, name, bases, namespace, shape=None, **kwargs):
        cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        if shape is not None:
            shape = Shape.cast(shape)
            lo, hi = (-(1 << (shape.width - 1)), (1 << (shape.width - 1)) - 1) if shape.signed else \
                (0, (1 << shape.width) - 1)
            for member in cls.__members__.values():
                if not (isinstance(member.value, int) and lo <= member.value <= hi):
                    raise TypeError(f"value {member.value!r} of enumeration member {member.name!r} does not fit "
                                    f"{shape!r}")
            cls._bits_shape = shape
        return cls

    def as_shape(cls) -> Shape:
        """The shape given with ``shape=``."""
        return cls._bits_shape


class Enum(_py_enum.Enum, metaclass=EnumType):
    """An enumeration with a shape (``amaranth.lib.enum.Enum``)."""


class Flag(_py_enum.Flag, metaclass=EnumType):
    """A set of flags with a shape (``amaranth.lib.enum.Flag``)."""


# -------------------------------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class Field:
    """A field of a layout: its shape (as declared: a :class:`Shape`, an enum class, a layout or a
    :class:`Struct` class) and bit offset."""

    shape: Any
    offset: int

    @property
    def width(self) -> int:
        return Shape.cast(self.shape).width


class Layout:
    """Base of :class:`StructLayout` and :class:`ArrayLayout` (``amaranth.lib.data.Layout``)."""

    size: int

    @staticmethod
    def cast(obj: Any) -> Layout:
        """``obj`` if it is a layout, the layout of a :class:`Struct` class.

        Raises
        ------
        TypeError
            For anything else.
        """
        if isinstance(obj, Layout):
            return obj
        if isinstance(obj, type) and issubclass(obj, Struct) and obj is not Struct:
            return obj._bits_layout
        raise TypeError(f"object {obj!r} cannot be converted to a data layout")

    def __getitem__(self, key: str | int) -> Field:
        raise NotImplementedError

    def __iter__(self) -> Iterator[tuple[str | int, Field]]:
        raise NotImplementedError


class StructLayout(Layout):
    """Fields back to back in the order given, the first at bit 0."""

    def __init__(self, members: Mapping[str, Any]):
        self._fields: dict[str, Field] = {}
        offset = 0
        for name, shape in members.items():
            if not isinstance(name, str):
                raise TypeError(f"field name must be a string, not {name!r}")
            self._fields[name] = Field(shape, offset)
            offset += Shape.cast(shape).width
        self.size = offset

    def __getitem__(self, key: str) -> Field:
        return self._fields[key]

    def __iter__(self) -> Iterator[tuple[str, Field]]:
        return iter(self._fields.items())

    def __repr__(self) -> str:
        return f"StructLayout({ {n: f.shape for n, f in self._fields.items()} !r})"


class ArrayLayout(Layout):
    """``length`` elements of ``elem_shape``, element 0 at bit 0."""

    def __init__(self, elem_shape: Any, length: int):
        if not isinstance(length, int) or length < 0:
            raise TypeError(f"array length must be a non-negative integer, not {length!r}")
        self.elem_shape, self.length = elem_shape, length
        self._width = Shape.cast(elem_shape).width
        self.size = self._width * length

    def __getitem__(self, key: int) -> Field:
        if not isinstance(key, int) or isinstance(key, bool):
            raise TypeError(f"array layout can only be indexed with an integer, not {key!r}")
        if not -self.length <= key < self.length:
            raise IndexError(f"index {key} is out of range for array layout of length {self.length}")
        return Field(self.elem_shape, (key % self.length) * self._width)

    def __iter__(self) -> Iterator[tuple[int, Field]]:
        return ((i, self[i]) for i in range(self.length))

    def __repr__(self) -> str:
        return f"ArrayLayout({self.elem_shape!r}, {self.length})"


class _StructType(type):
    def __new__(mcs, name, bases, namespace, **kwargs):
        cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        annotations = inspect.get_annotations(cls)
        if annotations:
            cls._bits_layout = StructLayout(annotations)
        return cls


class Struct(metaclass=_StructType):
    """Base class: the annotations of a subclass are its :class:`StructLayout` (``amaranth.lib.data.Struct``)."""


#: ``amaranth.lib.data`` as far as :mod:`hw.isa` uses it
data = types.SimpleNamespace(Shape=Shape, Field=Field, Layout=Layout, StructLayout=StructLayout,
                             ArrayLayout=ArrayLayout, Struct=Struct)
#: ``amaranth.lib.enum`` as far as :mod:`hw.isa` uses it
enum = types.SimpleNamespace(EnumType=EnumType, Enum=Enum, Flag=Flag)
