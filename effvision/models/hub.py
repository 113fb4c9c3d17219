"""Where pretrained weights come from: a local file, the Hugging Face cache, or a zoo card.

`pretrained` accepts
  - a path to a .pth / .safetensors file (or an effvision checkpoint);
  - `hf-hub:<repo_id>` (e.g. hf-hub:timm/mobilenetv3_small_100.lamb_in1k): read from the local
    Hugging Face cache; with HF_HUB_OFFLINE=1 (as in tests and air-gapped machines) nothing is
    downloaded, and a repo not in the cache is a one-line error saying how to fetch it;
  - `zoo`: the card's own trained weights (sha256-checked), else its `hub` repo.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import EffvisionError
from .cards import trained_weights_path
from .weights import sha256_of

HUB_PREFIX = "hf-hub:"
# timm publishes safetensors; older repos hold only the pickled-tensor file (read weights_only).
HUB_FILES = ("model.safetensors", "pytorch_model.bin")


def hub_file(repo_id: str) -> Path:
    """The weights file of a Hugging Face Hub repo, from the cache (downloaded only when online)."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError

    repo_id, _, revision = repo_id.partition("@")
    for filename in HUB_FILES:
        try:
            return Path(hf_hub_download(repo_id, filename, revision=revision or None))
        except (EntryNotFoundError, LocalEntryNotFoundError):
            continue
        except RepositoryNotFoundError:
            raise EffvisionError(f"no Hugging Face repo '{repo_id}'") from None
        except Exception as exc:  # noqa: BLE001  (network errors, permissions: one line)
            raise EffvisionError(f"cannot fetch {repo_id}: {str(exc).splitlines()[0]}") from None
    offline = " (HF_HUB_OFFLINE=1: nothing is downloaded)" if constants.HF_HUB_OFFLINE else ""
    raise EffvisionError(
        f"'{repo_id}' has none of {', '.join(HUB_FILES)} in the Hugging Face cache {constants.HF_HUB_CACHE}{offline}; "
        f"fetch it once online: huggingface-cli download {repo_id}"
    )


def card_weights(card) -> Path:
    """A card's pretrained weights for `pretrained: zoo`: its trained file (checked), else its hub repo."""
    path = trained_weights_path(card)
    if path is not None:
        if not path.is_file():
            raise EffvisionError(
                f"{card.name}: trained weights {path} are missing; rebuild them: {card.trained.command}"
            )
        if sha256_of(path) != card.trained.sha256:
            raise EffvisionError(f"{card.name}: {path} does not match the card's sha256 (modified or a different run)")
        return path
    if card.hub:
        return hub_file(card.hub)
    raise EffvisionError(f"card {card.name} has no pretrained weights (neither trained: nor hub:)")


def weights_file(source: str, card=None) -> Path:
    """The local file a `pretrained` value names."""
    if source == "zoo":
        if card is None:
            raise EffvisionError("pretrained: zoo needs a zoo card name (see `effvision zoo list`)")
        return card_weights(card)
    if source.startswith(HUB_PREFIX):
        return hub_file(source[len(HUB_PREFIX) :])
    return Path(source)
