"""Exports the training and held-out text from Debian packages and splits it by document.

Sources (nothing is downloaded):
  sword-text-web  World English Bible (SWORD module engWEB2015eb), exported with diatheke
  sword-text-kjv  King James Version (engKJV2006eb), exported with diatheke
  fortunes, fortunes-min  fortune(6) databases (/usr/share/games/fortunes)
A document is one book of one translation, or one fortune file. Held-out books are held out in
both translations (a translation of a held-out book in the training split would leak it).

  python3 tools/train/data.py OUT_DIR [--smoke]
writes OUT_DIR/train.txt, OUT_DIR/heldout.txt and OUT_DIR/documents.json.
"""
import html
import json
import os
import re
import subprocess
import sys

BOOKS = [
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth",
    "I Samuel", "II Samuel", "I Kings", "II Kings", "I Chronicles", "II Chronicles", "Ezra",
    "Nehemiah", "Esther", "Job", "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon",
    "Isaiah", "Jeremiah", "Lamentations", "Ezekiel", "Daniel", "Hosea", "Joel", "Amos",
    "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai", "Zechariah",
    "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "I Corinthians",
    "II Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians", "I Thessalonians",
    "II Thessalonians", "I Timothy", "II Timothy", "Titus", "Philemon", "Hebrews", "James",
    "I Peter", "II Peter", "I John", "II John", "III John", "Jude", "Revelation of John",
]
# About a tenth of the text, spread over the canon's kinds of writing (law, history, poetry,
# prophecy, gospel, letters), so held-out perplexity is not about one style.
HELDOUT_BOOKS = {"Numbers", "Ruth", "II Kings", "Nehemiah", "Ecclesiastes", "Jeremiah", "Jonah",
                 "Mark", "Romans", "Hebrews", "I Peter"}
TRANSLATIONS = {"web": "engWEB2015eb", "kjv": "engKJV2006eb"}
FORTUNE_DIR = "/usr/share/games/fortunes"
HELDOUT_FORTUNES = {"literature", "science", "wisdom"}

# diatheke prints "Book C:V: text"; psalm titles come before the reference, repeated on every
# verse of the psalm, so whatever precedes the reference is dropped.
VERSE = re.compile(r"(?:[1-3I]+ )?[A-Z][A-Za-z ]*? \d+:\d+: ?")


def clean(text):
    text = text.replace("\u2019", "'").replace("\u2018", "'")
    text = text.replace("\u201c", '"').replace("\u201d", '"').replace("\u2014", " - ")
    text = re.sub(r"[ \t]+", " ", text)
    return text.strip()


def export_book(module, book):
    # OSIS rather than plain text: the plain renderer drops the space between some adjacent
    # words (WEB's "Yahwehspoke"), which the OSIS word elements keep apart.
    out = subprocess.run(["diatheke", "-b", module, "-f", "osis", "-k", book],
                         capture_output=True, text=True, check=True).stdout
    out = re.sub(r"<note\b.*?</note>", "", out, flags=re.S)
    out = out.replace("</w><w", "</w> <w")
    out = re.sub(r"<milestone[^>]*/>", " ", out)
    out = html.unescape(re.sub(r"<[^>]+>", "", out))
    verses = []
    for line in out.splitlines():
        if line.startswith("(" + module):
            continue
        m = VERSE.search(line)
        if m:
            verses.append(line[m.end():])
        elif verses and line.strip():
            verses[-1] += " " + line  # poetry continues a verse on the next line
    return clean(" ".join(verses))


def fortune_docs():
    for name in sorted(os.listdir(FORTUNE_DIR)):
        path = os.path.join(FORTUNE_DIR, name)
        if "." in name or not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            items = [clean(x) for x in f.read().split("\n%\n")]
        text = "\n\n".join(x for x in items if x and len(x) < 2000)
        if len(text) > 2000:
            yield name, text


def main():
    out_dir = sys.argv[1]
    # --smoke: six short books per translation (one held out) and no fortunes, for the trainer's quick test.
    smoke = "--smoke" in sys.argv[2:]
    books = ["Ruth", "James", "Titus", "Jude", "Philemon", "Galatians"] if smoke else BOOKS
    os.makedirs(out_dir, exist_ok=True)
    docs = []
    for tag, module in TRANSLATIONS.items():
        for book in books:
            text = export_book(module, book)
            if len(text) < 1000:
                raise SystemExit(f"{module} {book}: exported only {len(text)} characters")
            docs.append({"name": f"{tag}/{book}", "split": "heldout" if book in HELDOUT_BOOKS else
                         "train", "text": text})
    for name, text in ([] if smoke else fortune_docs()):
        docs.append({"name": f"fortunes/{name}",
                     "split": "heldout" if name in HELDOUT_FORTUNES else "train", "text": text})
    for split in ("train", "heldout"):
        with open(os.path.join(out_dir, split + ".txt"), "w", encoding="utf-8") as f:
            for d in docs:
                if d["split"] == split:
                    f.write(d["text"] + "\n\n")
    summary = [{"name": d["name"], "split": d["split"], "chars": len(d["text"])} for d in docs]
    with open(os.path.join(out_dir, "documents.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for split in ("train", "heldout"):
        n = sum(d["chars"] for d in summary if d["split"] == split)
        print(f"{split}: {sum(1 for d in summary if d['split'] == split)} documents, {n} characters")


if __name__ == "__main__":
    main()
