"""Countdown equations: a small parser and exact evaluator for numbers, + - * /, unary minus and parentheses.

No eval: the text is tokenized by hand, so `**`, `//`, decimals ("3.5" fused from 3 and 5), names, calls and
non-ASCII digits are rejected with a reason. Sizes are bounded before any work: the expression's length, its
nesting depth, the digits of a number and the bits of every intermediate value (exact, as Fractions).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction

MAX_EQUATION_CHARS = 200
MAX_DEPTH = 16
MAX_DIGITS = 12
MAX_VALUE_BITS = 256

_OPS = "+-*/"
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


class EquationError(ValueError):
    """The text is not an allowed equation; the message says why."""


# A node is ("num", int), ("neg", node) or (op, left, right) with op in + - * /.
Node = tuple


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in " \t\r\n":
            i += 1
        elif "0" <= ch <= "9":
            j = i
            while j < len(text) and "0" <= text[j] <= "9":
                j += 1
            if j < len(text) and text[j] == ".":
                raise EquationError(
                    f"decimal number at '{text[i : j + 2]}': only the given whole numbers are allowed"
                )
            if j - i > MAX_DIGITS:
                raise EquationError(f"number with more than {MAX_DIGITS} digits")
            tokens.append(text[i:j])
            i = j
        elif ch in _OPS or ch in "()":
            if ch in "*/" and text[i + 1 : i + 2] == ch:
                raise EquationError(f"operator {ch * 2} is not allowed: use + - * / and parentheses")
            tokens.append(ch)
            i += 1
        elif ch == ".":
            raise EquationError("decimal point: only the given whole numbers are allowed")
        else:
            raise EquationError(f"character {ch!r} is not allowed: use digits, + - * / and parentheses")
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def expression(self) -> Node:
        node = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            node = (op, node, self.term())
        return node

    def term(self) -> Node:
        node = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            node = (op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.peek() == "-":
            self.take()
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise EquationError(f"nested deeper than {MAX_DEPTH} levels")
            node = ("neg", self.unary())
            self.depth -= 1
            return node
        return self.primary()

    def primary(self) -> Node:
        token = self.peek()
        if token is None:
            raise EquationError("incomplete expression")
        if token == "(":
            self.take()
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise EquationError(f"parentheses nested deeper than {MAX_DEPTH} levels")
            node = self.expression()
            if self.peek() != ")":
                raise EquationError("unbalanced parentheses")
            self.take()
            self.depth -= 1
            return node
        if token.isascii() and token.isdigit():
            self.take()
            return ("num", int(token))
        raise EquationError(f"unexpected {token!r}")


def parse_equation(text: str) -> Node:
    """The expression tree of an equation's left side; EquationError says why it is not allowed."""
    if len(text) > MAX_EQUATION_CHARS:
        raise EquationError(f"longer than {MAX_EQUATION_CHARS} characters")
    tokens = _tokenize(text)
    if not tokens:
        raise EquationError("empty")
    parser = _Parser(tokens)
    node = parser.expression()
    if parser.peek() is not None:
        raise EquationError(f"unexpected {parser.peek()!r} after a complete expression")
    return node


def numbers_used(node: Node) -> list[int]:
    """The number literals of a tree, left to right."""
    if node[0] == "num":
        return [node[1]]
    if node[0] == "neg":
        return numbers_used(node[1])
    return numbers_used(node[1]) + numbers_used(node[2])


@dataclass
class Evaluation:
    value: Fraction
    steps: list[str] = field(default_factory=list)  # "a op b = c" for every operation, innermost first


def _check_size(value: Fraction) -> Fraction:
    if max(abs(value.numerator).bit_length(), value.denominator.bit_length()) > MAX_VALUE_BITS:
        raise EquationError(f"an intermediate value exceeds {MAX_VALUE_BITS} bits")
    return value


def _show(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def evaluate(node: Node, steps: list[str] | None = None) -> Fraction:
    """Exact value of a tree; EquationError on division by zero or values that grow too large."""
    kind = node[0]
    if kind == "num":
        return Fraction(node[1])
    if kind == "neg":
        return -evaluate(node[1], steps)
    left, right = evaluate(node[1], steps), evaluate(node[2], steps)
    if kind == "+":
        value = left + right
    elif kind == "-":
        value = left - right
    elif kind == "*":
        value = left * right
    else:
        if right == 0:
            raise EquationError("division by zero")
        value = left / right
    value = _check_size(value)
    if steps is not None:
        steps.append(f"{_show(left)} {kind} {_show(right)} = {_show(value)}")
    return value


def split_equation(answer: str, target: int | None = None) -> str:
    """The expression part of an answer: "expr" or "expr = target" (the right side must be the target)."""
    if answer.count("=") > 1:
        raise EquationError("more than one '='")
    if "=" not in answer:
        return answer
    left, right = answer.split("=")
    right = right.strip()
    if not (right.isascii() and right.lstrip("-").isdigit() and len(right) <= MAX_DIGITS):
        raise EquationError(f"right side {right!r} of '=' is not a whole number")
    if target is not None and int(right) != target:
        raise EquationError(f"right side {right} of '=' is not the target {target}")
    return left


def check_equation(answer: str, nums: list[int], target: int) -> str | None:
    """None when the answer reaches the target using every given number exactly once; else the reason why not.

    Rule (as in the reference Countdown recipe): all numbers must be used, each exactly once, and no others.
    """
    try:
        node = parse_equation(split_equation(answer, target))
        used = Counter(numbers_used(node))
        given = Counter(int(n) for n in nums)
        if used != given:
            extra, missing = used - given, given - used
            parts = []
            if extra:
                parts.append(f"uses {sorted(extra.elements())} not given (or more often than given)")
            if missing:
                parts.append(f"leaves {sorted(missing.elements())} unused")
            return "; ".join(parts)
        value = evaluate(node)
    except EquationError as err:
        return str(err)
    if value != target:
        return f"equals {_show(value)}, not {target}"
    return None


def format_tree(node: Node, parent: str = "", right_side: bool = False) -> str:
    """The expression as text with only the parentheses it needs."""
    kind = node[0]
    if kind == "num":
        return str(node[1])
    if kind == "neg":
        return "-" + format_tree(node[1], "neg")
    text = f"{format_tree(node[1], kind)} {kind} {format_tree(node[2], kind, True)}"
    if parent == "neg":
        return f"({text})"
    precedence, parent_precedence = _PRECEDENCE[kind], _PRECEDENCE.get(parent, 0)
    # a - (b + c) and a / (b * c) need their parentheses; a + (b + c) and a * (b * c) don't.
    needs = precedence < parent_precedence or (
        right_side and precedence == parent_precedence and parent in "-/"
    )
    return f"({text})" if needs else text
