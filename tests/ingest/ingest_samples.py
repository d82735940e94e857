"""Hand-written inputs shared by the ingest tests: an HTML page and one record per JSON format."""

PAGE = b"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title> A  small
 page </title><style>p { color: red }</style><script>var s = "<p>not text</p>";</script></head>
<body>
  <h1>Main   title</h1>
  <div class="intro note" id="first">
    <p>Hello <b>bold</b> world &amp; caf\xc3\xa9.</p>
    <p style="display:none">hidden paragraph</p>
    <p hidden>also hidden</p>
    <p>Second<br>line</p>
  </div>
  <!-- a comment -->
  <table><tr><th>Name</th><td>1</td></tr><tr><td>B</td><td><span style="font-size: 2em">big</span></td></tr></table>
  <pre>
  code   keeps
spaces</pre>
  <template><p>template text</p></template><noscript>enable js</noscript>
  tail text
</body></html>"""

EXPECTED_TEXT = (
    "Main title\nHello bold world & caf\u00e9.\nSecond\nline\nName\t1\nB\tbig\n  code   keeps\nspaces\ntail text"
)


HOTPOT = {
    "_id": "5a8b57f25542995d1e6f1371",
    "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
    "answer": "yes",
    "type": "comparison",
    "level": "hard",
    "supporting_facts": [["Scott Derrickson", 0], ["Ed Wood", 0], ["Ed Wood", 7]],
    "context": [
        ["Ed Wood", ["Edward Davis Wood Jr. was an American filmmaker.", " He died in 1978.", "  "]],
        [
            "Scott Derrickson",
            ["Scott Derrickson (born July 16, 1966) is an American director.", " He lives in Los Angeles."],
        ],
    ],
}

WIKIHOP = {
    "id": "WH_train_0",
    "query": "participant_of juan rossell",
    "answer": "1996 summer olympics",
    "candidates": ["1996 summer olympics", "olympic games", "sport"],
    "supports": [
        "The 1996 Summer Olympics were held in Atlanta. Juan Rossell competed there.",
        "",
        "The Olympic Games are a sport event. Sport is fun.",
    ],
}

NQ_TOKENS = (
    "<H1> Sun </H1> <P> The Sun is a star . </P> "
    "<Table> <Tr> <Td> Mass </Td> <Td> 2e30 kg </Td> </Tr> </Table> <Ul> <Li> hot </Li> </Ul>"
).split(" ")
NQ = {
    "example_id": 797803103760793766,
    "document_url": "https://en.wikipedia.org/wiki/Sun",
    "question_text": "what is the sun",
    "document_text": " ".join(NQ_TOKENS),
    "long_answer_candidates": [
        {"start_token": 3, "end_token": 11, "top_level": True},  # <P> ... </P>
        {"start_token": 11, "end_token": 22, "top_level": True},  # <Table> ... </Table>
        {"start_token": 12, "end_token": 21, "top_level": False},  # <Tr> ... </Tr>
        {"start_token": 22, "end_token": 27, "top_level": True},  # <Ul> ... </Ul>
    ],
    "annotations": [
        {
            "long_answer": {"start_token": 3, "end_token": 11, "candidate_index": 0},
            "short_answers": [{"start_token": 8, "end_token": 9}],
            "yes_no_answer": "NONE",
        }
    ],
}


# A mapping file for records of people (ingest/mapping.py): ids, attrs, links, nested fields.
PEOPLE_MAPPING = {
    "fields": {
        "people": {
            "each": {
                "type": "person",
                "id": "name",
                "attrs": {"years": "age"},
                "links": {"knows": "knows"},
                "relation": None,
                "fields": {
                    "bio": {"type": "bio", "relation": "described_by"},
                    "nick": {"type": "nick", "optional": True},
                },
            }
        }
    },
}
