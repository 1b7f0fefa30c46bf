"""Class heads over open_clip's text tower.

Two kinds:
- fixed heads: templates -> one normalised embedding per class (zero-shot, ensembles);
- `ContextPrompt`: CoOp/TPT-style learnable context vectors in front of each class
  name, differentiable with respect to the context.

Both run the text transformer only over the positions up to the longest prompt's
end-of-text token. The tower is causal, so positions after a sequence's EOT never
influence the EOT feature: the truncation is exact (tested against the full
77-token `encode_text`); a tower without a causal mask runs all positions.
`ContextPrompt` also runs the "[SOT] context" prefix, which every class shares, only
once per context (`prefix_tower`).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from .clip_model import ClipModel
from .head_cache import MIN_PROMPTS, cached_head
from .prefix_tower import prefix_text_features, supports_prefix_sharing, tail_buckets

DEFAULT_TEMPLATE = "a photo of a {}."
# Tip-Adapter's 7 ImageNet templates: the template half of DMN's `tip_cupl` head
# (in DMN's order, which sets the summation order of the mean)
TIP_TEMPLATES = ("a bad photo of the {}.", "a {} in a video game.", "a origami {}.", "a photo of the small {}.",
                 "art of the {}.", "a photo of the large {}.", "itap of a {}.")


def _is_plain(text: str) -> bool:
    """True when ftfy.fix_text and html.unescape are the identity on `text`: printable ASCII holds no
    mojibake, ligature, wide or curly character, control character or line break for ftfy to fix,
    and without '&' no HTML entity."""
    return text.isascii() and text.isprintable() and "&" not in text


class _FastTokenizer:
    """open_clip's CLIP tokenizer (SimpleTokenizer, `lower` cleaning, truncation keeping EOT last),
    with two shortcuts that change no token: the text cleaning (ftfy) is skipped where it is the
    identity (`_is_plain`), and each word's BPE ids are kept once computed. Tokenising CLIP's 80
    templates x 1000 classes (80,000 prompts) drops from ~7 s to ~1 s on 2 cores; tests/test_text.py
    checks the tokens against open_clip.tokenize's."""

    def __init__(self) -> None:
        from open_clip.tokenizer import SimpleTokenizer
        self.tok = SimpleTokenizer()
        self.word_ids: dict[str, list[int]] = {}

    def _word(self, word: str) -> list[int]:
        ids = self.word_ids.get(word)
        if ids is None:
            tok = self.tok
            unicode_word = "".join(tok.byte_encoder[b] for b in word.encode("utf-8"))
            ids = self.word_ids[word] = [tok.encoder[t] for t in tok.bpe(unicode_word).split(" ")]
        return ids

    def encode(self, text: str) -> list[int]:
        from open_clip.tokenizer import whitespace_clean
        tok = self.tok
        text = whitespace_clean(text.strip()).lower() if _is_plain(text) else tok.clean_fn(text)
        return [i for word in tok.pat.findall(text) for i in self._word(word)]

    def __call__(self, texts: Sequence[str], context_length: int) -> torch.Tensor:
        sot, eot = self.tok.sot_token_id, self.tok.eot_token_id
        out = torch.zeros(len(texts), context_length, dtype=torch.long)
        rows = out.numpy()
        for i, text in enumerate(texts):
            ids = [sot, *self.encode(text), eot]
            if len(ids) > context_length:
                ids = ids[:context_length]
                ids[-1] = eot
            rows[i, :len(ids)] = ids
        return out


@functools.lru_cache(maxsize=1)
def _tokenizer() -> _FastTokenizer:
    return _FastTokenizer()


def tokenize(texts: Sequence[str], context_length: int = 77) -> torch.Tensor:
    """(len(texts), context_length) int64 CLIP tokens, equal to open_clip.tokenize's."""
    return _tokenizer()(list(texts), context_length)


def _eot_positions(tokens: torch.Tensor) -> torch.Tensor:
    # CLIP's BPE gives end-of-text the largest id, so argmax finds it (as open_clip does).
    return tokens.argmax(dim=-1)


def _tower_length(clip: nn.Module, eot: torch.Tensor) -> int:
    """Positions the tower must run: up to the longest EOT when it is causal, else all of them."""
    return int(eot.max()) + 1 if clip.attn_mask is not None else clip.context_length


def run_text_tower(clip: nn.Module, embeddings: torch.Tensor, eot: torch.Tensor) -> torch.Tensor:
    """Token embeddings (B, L, W) -> unnormalised text features (B, D), over L positions only."""
    length = embeddings.shape[1]
    cast_dtype = clip.transformer.get_cast_dtype()
    x = embeddings.to(cast_dtype) + clip.positional_embedding[:length].to(cast_dtype)
    mask = clip.attn_mask[:length, :length] if clip.attn_mask is not None else None
    x = clip.transformer(x, attn_mask=mask)
    x = clip.ln_final(x)
    x = x[torch.arange(x.shape[0], device=x.device), eot]
    proj = clip.text_projection
    return proj(x) if isinstance(proj, nn.Linear) else x @ proj


@torch.no_grad()
def encode_texts(model: ClipModel, texts: Sequence[str], batch_size: int = 256, normalize: bool = True) -> torch.Tensor:
    """Text features (len(texts), D) with the truncated tower, normalised unless `normalize` is False."""
    clip = model.clip
    tokens = tokenize(texts, clip.context_length).to(model.device)
    eot = _eot_positions(tokens)
    length = _tower_length(clip, eot)
    out = []
    for start in range(0, len(texts), batch_size):
        tok = tokens[start:start + batch_size, :length]
        emb = clip.token_embedding(tok)
        out.append(run_text_tower(clip, emb, eot[start:start + batch_size]).float())
    return F.normalize(torch.cat(out), dim=-1) if normalize else torch.cat(out)


def _as_formatter(template: str | Callable[[str], str]) -> Callable[[str], str]:
    return template if callable(template) else template.format


def class_head(model: ClipModel, classnames: Sequence[str],
               templates: Iterable[str | Callable[[str], str]] = (DEFAULT_TEMPLATE,)) -> torch.Tensor:
    """Class embeddings (C, D): normalise(mean over templates of normalised embeddings)."""
    formatters = [_as_formatter(t) for t in templates]
    names = [c.replace("_", " ") for c in classnames]  # as ContextPrompt does, so both heads read alike
    prompts = [[f(c) for c in names] for f in formatters]

    def build() -> torch.Tensor:
        many = len(prompts) * len(names) >= MIN_PROMPTS
        rows = tqdm(prompts, desc=f"text head: {len(prompts)} templates x {len(names)} classes", unit="template",
                    leave=False, disable=not many or None)
        per_template = torch.stack([encode_texts(model, texts) for texts in rows])
        return F.normalize(per_template.mean(dim=0), dim=-1)

    return cached_head(model.clip, model.device, [p for texts in prompts for p in texts], build)


def pooled_class_head(model: ClipModel, prompts_per_class: Sequence[Sequence[str]]) -> torch.Tensor:
    """Class embeddings (C, D) from a list of sentences per class (any number each):
    normalise(mean of the normalised embeddings of the class's sentences)."""
    flat = [p for prompts in prompts_per_class for p in prompts]
    feats = encode_texts(model, flat)
    sizes = [len(prompts) for prompts in prompts_per_class]
    return F.normalize(torch.stack([f.mean(0) for f in feats.split(sizes)]), dim=-1)


def read_class_sentences(path: str, field: str, what: str = "sentences (CuPL's format)") -> dict[str, list[str]]:
    """A JSON file {class name: [sentence, ...]} (CuPL's descriptions, TPS's descriptors), or a one-line
    ValueError naming `field` (unreadable, a directory, not JSON, not that shape)."""
    import json
    import os
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            data = json.load(f)
    except IsADirectoryError:
        raise ValueError(f"{field}: {path!r} is a directory; pass the file itself") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{field}: cannot read {path!r} ({getattr(err, 'strerror', None) or err})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{field}: {path!r} is not JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(data, dict) or not all(
            isinstance(v, list) and all(isinstance(s, str) for s in v) for v in data.values()):
        raise ValueError(f"{field}: {path!r} must map each class name to a list of {what}")
    return data


def load_descriptions(path: str, classnames: Sequence[str], field: str = "cupl_file") -> list[list[str]]:
    """Per class, its sentences from a CuPL-format JSON file ({class name: [sentence, ...]}), looked up
    by the name with "_" read as " " (as DMN does). A class missing from the file, or mapped to no
    sentence (`[]`, or only blank strings), is refused: a one-line ValueError naming `field`."""
    data = read_class_sentences(path, field)
    names = [c.replace("_", " ") for c in classnames]
    # a class that is absent, or listed with no sentence (or only blank ones), has no description
    missing = [n for n in names if not any(s.strip() for s in data.get(n, []))]
    if missing:
        shown = ", ".join(repr(n) for n in missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise ValueError(f"{field}: {path!r} has no sentences for {len(missing)} of {len(names)} classes: {shown}")
    return [list(data[n]) for n in names]


def tip_cupl_head(model: ClipModel, classnames: Sequence[str], descriptions: Sequence[Sequence[str]],
                  templates: Sequence[str] = TIP_TEMPLATES) -> torch.Tensor:
    """DMN's `tip_cupl` head (YBZh/DMN `get_text_features`): per class, the templates (the 7 Tip-Adapter
    ones on ImageNet; a fine-grained set's own, `ID_to_prompts`) and the class's descriptions pooled into
    one set of sentences, normalised embeddings averaged, renormalised."""
    names = [c.replace("_", " ") for c in classnames]
    return pooled_class_head(model, [[t.format(n) for t in templates] + list(d)
                                     for n, d in zip(names, descriptions)])


class ContextPrompt(nn.Module):
    """Learnable context vectors shared by all classes: [SOS] ctx_1..ctx_n name . [EOT].

    `ctx_init` is a string whose token embeddings initialise the context ("a photo of a"),
    None for random N(0, 0.02) init (CoOp), or a tensor (n_ctx, width), e.g. a CoOp
    checkpoint's `ctx`. The class name follows the context, then ".".
    """

    def __init__(self, model: ClipModel, classnames: Sequence[str], n_ctx: int = 4,
                 ctx_init: str | torch.Tensor | None = "a photo of a", seed: int = 0,
                 share_prefix: bool = True):
        super().__init__()
        clip = model.clip
        self.clip = clip
        # True: run [SOT] + context once per context, not once per class, where the tower allows it
        # (prefix_tower: same math, another evaluation order); False: the whole prompt per class
        self.share_prefix = share_prefix and supports_prefix_sharing(clip)
        width = clip.token_embedding.weight.shape[1]
        names = [c.replace("_", " ") for c in classnames]
        if isinstance(ctx_init, torch.Tensor):
            # the tensor fixes the number of context tokens (a CoOp checkpoint may hold 16)
            if ctx_init.dim() == 3 and ctx_init.shape[0] == 1:
                ctx_init = ctx_init[0]
            if ctx_init.dim() != 2 or ctx_init.shape[1] != width:
                raise ValueError(f"ctx_init tensor must be (n_ctx, {width}), got {tuple(ctx_init.shape)} "
                                 "(class-specific contexts are not supported)")
            n_ctx = ctx_init.shape[0]
        if isinstance(ctx_init, str):
            # here, not at the top: open_clip imports torchvision, which imports torch._dynamo (seconds at import)
            import open_clip
            init_words = ctx_init.replace("_", " ")
            n_ctx = len(open_clip.tokenize([init_words])[0].nonzero()) - 2
            prefix = init_words
        else:
            prefix = " ".join(["X"] * n_ctx)
        tokens = tokenize([f"{prefix} {name}." for name in names], clip.context_length).to(model.device)
        eot = _eot_positions(tokens)
        self.length = _tower_length(clip, eot)
        with torch.no_grad():
            embedding = clip.token_embedding(tokens[:, :self.length]).float()
        if isinstance(ctx_init, str):
            init = embedding[0, 1:1 + n_ctx].clone()
        elif ctx_init is None:
            gen = torch.Generator().manual_seed(seed)
            init = (torch.randn(n_ctx, width, generator=gen) * 0.02).to(model.device)
        else:
            init = ctx_init.detach().float().to(model.device).reshape(n_ctx, width)
        self.n_ctx = n_ctx
        self.register_buffer("tokens", tokens, persistent=False)
        self.register_buffer("eot", eot, persistent=False)
        # the class tails after "[SOT] context" and their length buckets: fixed, so planned once here
        self.register_buffer("tail_eot", eot - (1 + n_ctx), persistent=False)
        self.tail_buckets = tail_buckets(self.tail_eot) if self.share_prefix else None
        self.register_buffer("prefix", embedding[:, :1].clone(), persistent=False)
        self.register_buffer("suffix", embedding[:, 1 + n_ctx:].clone(), persistent=False)
        self.register_buffer("init_ctx", init.clone(), persistent=False)
        self.ctx = nn.Parameter(init.clone())

    @property
    def n_classes(self) -> int:
        return self.tokens.shape[0]

    def reset(self) -> None:
        with torch.no_grad():
            self.ctx.copy_(self.init_ctx)

    def embeddings(self, ctx: torch.Tensor) -> torch.Tensor:
        """ctx (B, n_ctx, W) -> prompt embeddings (B*C, L, W)."""
        b, c = ctx.shape[0], self.n_classes
        ctx = ctx.unsqueeze(1).expand(b, c, *ctx.shape[1:])
        prefix = self.prefix.unsqueeze(0).expand(b, *self.prefix.shape)
        suffix = self.suffix.unsqueeze(0).expand(b, *self.suffix.shape)
        return torch.cat([prefix, ctx.to(prefix.dtype), suffix], dim=2).flatten(0, 1)

    def features(self, ctx: torch.Tensor | None = None, normalize: bool = True) -> torch.Tensor:
        """Class features for one context (n_ctx, W) -> (C, D) or a batch (B, n_ctx, W) -> (B, C, D)."""
        ctx = self.ctx if ctx is None else ctx
        single = ctx.dim() == 2
        batch = ctx.unsqueeze(0) if single else ctx
        if self.share_prefix:
            prefix = torch.cat([self.prefix[0].expand(batch.shape[0], 1, -1), batch.to(self.prefix.dtype)], dim=1)
            feats = prefix_text_features(self.clip, prefix, self.suffix, self.tail_eot, self.tail_buckets).float()
        else:
            eot = self.eot.repeat(batch.shape[0])
            feats = run_text_tower(self.clip, self.embeddings(batch), eot)
            feats = feats.view(batch.shape[0], self.n_classes, -1).float()
        if normalize:
            feats = F.normalize(feats, dim=-1)
        return feats[0] if single else feats

    def forward(self, ctx: torch.Tensor | None = None) -> torch.Tensor:
        return self.features(ctx)
