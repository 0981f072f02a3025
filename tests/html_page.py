"""An HTML page read back for the tests of detaudit's pages (``run_html``,
``resume_html``): every element closed in order, the tables' cells, the
attributes that load things, the text of the elements of each class."""

from __future__ import annotations

from html.parser import HTMLParser

VOID_TAGS = {"meta", "img", "br", "hr", "input", "link", "col", "area", "base", "source", "wbr"}


class Page(HTMLParser):
    """Checks that every element is closed in order; collects the tables,
    the attributes that load things, and the text of chosen elements."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.problems: list[str] = []
        self.links: list[tuple[str, str, str]] = []  # (tag, attribute, value) of src/href
        self.tables: dict[str, list[list[tuple[str, str | None]]]] = {}  # id -> rows of (text, data-value)
        self.classes: dict[str, list[str]] = {}  # class -> texts of the elements that carry it
        self._table = self._cell = None
        self._texts: list[tuple[str, int, list[str]]] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        for name in ("src", "href", "action", "poster", "srcset"):
            if name in attributes:
                self.links.append((tag, name, attributes[name] or ""))
        if tag == "table":
            self._table = attributes.get("id") or f"table-{len(self.tables)}"
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = ["", attributes.get("data-value")]
        for css in (attributes.get("class") or "").split():
            self._texts.append((css, len(self.open), []))
        if tag not in VOID_TAGS:
            self.open.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID_TAGS:
            return
        if not self.open or self.open[-1] != tag:
            self.problems.append(f"</{tag}> closes <{self.open[-1] if self.open else None}>")
            return
        self.open.pop()
        if tag in ("td", "th") and self._cell is not None:
            self.tables[self._table][-1].append((self._cell[0].strip(), self._cell[1]))
            self._cell = None
        elif tag == "table":
            self._table = None
        while self._texts and self._texts[-1][1] == len(self.open):
            css, _, parts = self._texts.pop()
            self.classes.setdefault(css, []).append("".join(parts))

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[0] += data
        for _, _, parts in self._texts:
            parts.append(data)


def parse(page: str) -> Page:
    parser = Page()
    parser.feed(page)
    parser.close()
    assert parser.problems == [] and parser.open == [], (parser.problems, parser.open)
    return parser


def rows(parser: Page, table: str) -> list[list[tuple[str, str | None]]]:
    return parser.tables[table][1:]  # without the header
