"""Our SentencePiece model as a Hugging Face fast tokenizer (`tokenizer.json` + its config files).

`AutoTokenizer.from_pretrained(DIR)` then gives the ids of `data.tokenizer.Tokenizer.encode_batch`
(no BOS/EOS: pre-training rows and probe rows carry none, so `add_special_tokens=True`, the
default, adds nothing). Built with the `tokenizers` library from the model proto, following what
SentencePiece does when it encodes (our trainer's options: `nmt_nfkc` normalisation, extra
whitespace removed, a dummy "▁" prefix, spaces escaped as "▁", byte fallback, `[MASK]` a
user-defined piece):

  normalizer     the proto's precompiled charsmap (NFKC + NMT rules: tabs, newlines and other
                 control characters become spaces), then runs of spaces collapsed to one and a
                 trailing space dropped, then " " -> "▁". A leading space is kept as the "▁" it
                 becomes: the dummy prefix below is only added when the text does not already
                 start with one, so "  hi" and "hi" both give "▁hi", as in SentencePiece.
  pre-tokenizer  Metaspace, prepend "▁" to the start of the text only (`prepend_scheme="first"`),
                 no splitting.
  model          BPE: SentencePiece merges any two adjacent symbols whose concatenation is a
                 piece, highest piece score first; a `tokenizers` BPE merges listed pairs, lowest
                 rank first. So every split (left, right) of every normal piece into two normal
                 pieces becomes a merge, ranked by the piece's score (then its id), and characters
                 outside the vocabulary fall back to their UTF-8 byte pieces <0xNN>.
                 Unigram: the same pieces and scores (control and byte pieces cannot match text).
  added tokens   `[MASK]` (normalized=True: matched in the normalised text, so "a [MASK] b" gives
                 ▁ a ▁ [MASK] ▁b as SentencePiece does); `<pad>` and `<unk>` as the special tokens
                 transformers registers anyway.
  decoder        "▁" -> " ", byte fallback, fused, the dummy prefix stripped.

Known differences from SentencePiece (none occurs in ordinary text; `SELF_CHECK` texts are
compared at every export, and the parity tests compare real text):
  * a text that *starts* with "[MASK]" gets no leading "▁" before the mask id;
  * a literal "<pad>" or "<unk>" in a text is the special token (transformers' behaviour for
    special tokens), where SentencePiece spells it out in pieces. BOS/EOS are not registered.
"""

from __future__ import annotations

import json

from cbert_jax.errors import ConfigError

# A few texts with whitespace, Unicode and byte-fallback edge cases; compared at every export.
SELF_CHECK = (
  "",
  " ",
  "hello world",
  "  leading and trailing  ",
  "tab\tand\nnewline  \n  here",
  "Numbers 1234, 3.14159 and -42!",
  "x [MASK] y",
  "x[MASK]y",
  "   [MASK] after spaces",
  "Café déjà vu — naïve façade",
  "ﬁne ¼ ＡＢＣ \u3000 ideographic space",
  "emoji 😀👍🏽 ok",
  "中文字符 and العربية",
  "----- ..... ===== _____",
  'it\'s "quoted" (parens) [brackets] {braces}',
  "a" * 300,
  "CamelCaseWords andMixed123Digits",
)

MODEL_BPE, MODEL_UNIGRAM = 2, 1  # sentencepiece TrainerSpec.ModelType
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6  # ModelProto.SentencePiece.Type


def _proto(model_path: str):
  from sentencepiece import sentencepiece_model_pb2 as pb  # pylint: disable=import-outside-toplevel

  m = pb.ModelProto()
  with open(model_path, "rb") as f:
    m.ParseFromString(f.read())
  return m


def _bpe_merges(pieces) -> list[tuple[str, str]]:
  """Every (left, right) with left + right a normal piece and both parts normal pieces, ranked as
  SentencePiece would apply them: higher piece score first, then lower piece id, then the split
  point (two splits of one piece have one score; SentencePiece takes the leftmost candidate)."""
  normal = {p.piece: (p.score, i) for i, p in enumerate(pieces) if p.type == NORMAL}
  ranked = []
  for piece, (score, i) in normal.items():
    for cut in range(1, len(piece)):
      left, right = piece[:cut], piece[cut:]
      if left in normal and right in normal:
        ranked.append((-score, i, cut, left, right))
  ranked.sort()
  return [(left, right) for *_, left, right in ranked]


def build(model_path: str):
  """A `tokenizers.Tokenizer` equivalent to the SentencePiece model at `model_path`.

  Raises:
    ConfigError: a SentencePiece option this conversion does not reproduce.
  """
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers  # pylint: disable=import-outside-toplevel

  m = _proto(model_path)
  ts, ns = m.trainer_spec, m.normalizer_spec
  where = f"tokenizer {model_path}"
  if ts.treat_whitespace_as_suffix:
    raise ConfigError(f"{where}: treat_whitespace_as_suffix=true cannot be exported")
  if ns.add_dummy_prefix and not ns.remove_extra_whitespaces:
    raise ConfigError(
      f"{where}: add_dummy_prefix without remove_extra_whitespaces cannot be exported exactly"
    )
  pieces = list(m.pieces)
  unk = pieces[ts.unk_id].piece
  if ts.model_type == MODEL_BPE:
    model = models.BPE(
      vocab={p.piece: i for i, p in enumerate(pieces)},
      merges=_bpe_merges(pieces),
      unk_token=unk,
      byte_fallback=bool(ts.byte_fallback),
      fuse_unk=True,
    )
  elif ts.model_type == MODEL_UNIGRAM:
    # Only normal (and user-defined) pieces match text in SentencePiece; the others keep their ids
    # with a score no segmentation chooses.
    scores = [(p.piece, p.score if p.type in (NORMAL, USER_DEFINED) else -1e9) for p in pieces]
    model = models.Unigram(scores, unk_id=int(ts.unk_id), byte_fallback=bool(ts.byte_fallback))
  else:
    raise ConfigError(f"{where}: model_type {ts.model_type} cannot be exported (bpe or unigram)")
  tok = Tokenizer(model)

  norm = []
  if ns.precompiled_charsmap:
    norm.append(normalizers.Precompiled(ns.precompiled_charsmap))
  if ns.remove_extra_whitespaces:
    norm += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex(r" \z"), "")]
    if not ns.add_dummy_prefix:
      norm.append(normalizers.Replace(Regex(r"\A "), ""))
  if ns.escape_whitespaces:
    norm.append(normalizers.Replace(" ", "▁"))
  tok.normalizer = normalizers.Sequence(norm)
  tok.pre_tokenizer = pre_tokenizers.Metaspace(
    replacement="▁", prepend_scheme="first" if ns.add_dummy_prefix else "never", split=False
  )
  dec = [decoders.Replace("▁", " ")]
  if ts.byte_fallback:
    dec.append(decoders.ByteFallback())
  dec.append(decoders.Fuse())
  if ns.add_dummy_prefix:
    dec.append(decoders.Strip(" ", 1, 0))
  tok.decoder = decoders.Sequence(dec)

  specials = [
    AddedToken(p.piece, special=True, normalized=p.type == USER_DEFINED)
    for i, p in enumerate(pieces)
    if p.type == USER_DEFINED or i in (ts.pad_id, ts.unk_id)
  ]
  tok.add_special_tokens(specials)
  return tok


def check(tokenizer, model_path: str, texts=SELF_CHECK) -> list[tuple[str, list[int], list[int]]]:
  """(text, ours, SentencePiece's) for every text whose ids differ (empty: all equal)."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel

  sp = spm.SentencePieceProcessor(model_file=model_path)
  texts = list(texts)
  ref = sp.encode(texts, out_type=int, add_bos=False, add_eos=False)
  got = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
  return [(t, a, b) for t, a, b in zip(texts, got, ref) if a != b]


def files(cbert_tok, max_length: int) -> dict[str, str]:
  """{file name: text} of the Hugging Face tokenizer: tokenizer.json, tokenizer_config.json,
  special_tokens_map.json.

  Raises:
    ConfigError: the conversion disagrees with SentencePiece on one of `SELF_CHECK`'s texts.
  """
  path = cbert_tok.model_path
  tok = build(path)
  bad = check(tok, path)
  if bad:
    text, got, ref = bad[0]
    raise ConfigError(
      f"tokenizer {path}: the exported tokenizer gives {got[:12]} for {text!r}, "
      f"SentencePiece {ref[:12]} ({len(bad)} of {len(SELF_CHECK)} check texts "
      "differ); it cannot be exported exactly"
    )
  sp_piece = cbert_tok.id_to_piece
  special = {
    "pad_token": sp_piece(cbert_tok.pad_id),
    "unk_token": sp_piece(cbert_tok.unk_id),
    "mask_token": sp_piece(cbert_tok.mask_id),
  }
  config = {
    # The generic fast tokenizer (TokenizersBackend in transformers 5): a model-specific class
    # (LlamaTokenizer for model_type llama) would rebuild the pipeline and add <s>.
    "tokenizer_class": "PreTrainedTokenizerFast",
    **special,
    "add_bos_token": False,
    "add_eos_token": False,
    "model_max_length": int(max_length),
    "padding_side": "right",
    "truncation_side": "right",
    "clean_up_tokenization_spaces": False,
    "model_input_names": ["input_ids", "attention_mask"],
  }
  return {
    "tokenizer.json": tok.to_str(pretty=True),
    "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
    "special_tokens_map.json": json.dumps(special, indent=2) + "\n",
  }
