"""Enumerations of the event layout.

On the wire an enum is a lower-case string; in Arrow it is the small integer code
given by its position in these tuples. Append new values at the end only: the codes
of existing values must never change (bump the layout version when you append).
"""

from __future__ import annotations

SURFACES: tuple[str, ...] = (
    "facebook_feed",
    "facebook_reels",
    "facebook_stories",
    "facebook_marketplace",
    "instagram_feed",
    "instagram_reels",
    "instagram_stories",
    "instagram_explore",
    "messenger",
    "audience_network",
    "threads",
    "whatsapp_status",
)

EVENT_TYPES: tuple[str, ...] = (
    "impression",
    "click",
    "like",
    "comment",
    "share",
    "save",
    "video_view",
    "follow",
    "hide",
    "conversion",
    "app_install",
    "offsite_conversion",
)

DEVICES: tuple[str, ...] = ("ios", "android", "web")

#: Event types that count as a conversion label for a preceding impression.
CONVERSION_TYPES: tuple[str, ...] = ("conversion", "app_install", "offsite_conversion")

SURFACE_CODE: dict[str, int] = {name: code for code, name in enumerate(SURFACES)}
EVENT_TYPE_CODE: dict[str, int] = {name: code for code, name in enumerate(EVENT_TYPES)}
DEVICE_CODE: dict[str, int] = {name: code for code, name in enumerate(DEVICES)}

IMPRESSION = EVENT_TYPE_CODE["impression"]
CLICK = EVENT_TYPE_CODE["click"]
CONVERSION_CODES: tuple[int, ...] = tuple(EVENT_TYPE_CODE[t] for t in CONVERSION_TYPES)

#: Stages of the ranking funnel, widest first (CANDIDATE_SET ``stage``): retrieval hands its ads
#: to early ranking, which narrows them for late ranking, which narrows them for the auction.
FUNNEL_STAGES: tuple[str, ...] = ("retrieval", "early", "late", "auction")
FUNNEL_STAGE_CODE: dict[str, int] = {name: code for code, name in enumerate(FUNNEL_STAGES)}
