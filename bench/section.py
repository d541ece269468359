"""Writes one `## ` section of docs/benchmarks.md: replaced where it is,
else added at the end."""


def write_section(doc: str, section: str) -> None:
    title = section.splitlines()[0]
    text = open(doc).read()
    start = text.find("\n" + title + "\n")
    if start >= 0:
        nxt = text.find("\n## ", start + 1)
        text = text[: start + 1] + section + (text[nxt:] if nxt >= 0 else "\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    open(doc, "w").write(text)
