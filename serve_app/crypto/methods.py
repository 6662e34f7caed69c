"""Which JSON-RPC methods the proxy forwards, and at which pricing tier.

An allow-list per chain family: anything not listed is refused before the node is called.
Tiers multiply a network's base credits: standard 1x, advanced 2x (traces, debug traces,
txpool summaries), large 4x (trace replays, the whole txpool, Solana's supply scans). Refused
with a reason: signing, account and node-administration methods (the node's keys and
controls are the operator's), stateful filters (filter state lives on one backend of a
load-balanced pool: use eth_getLogs), WebSocket-only subscriptions (this proxy is HTTP-only),
a method of another chain family, and anything unmapped.
"""

from __future__ import annotations

from dataclasses import dataclass

from serve_app.crypto.networks import Family

STANDARD, ADVANCED, LARGE = 1, 2, 4

# Credits of a call the node answered with a JSON-RPC error, whatever its tier.
ERROR_CREDITS = 5

FAMILY_NAMES: dict[str, str] = {"evm": "EVM", "solana": "Solana", "starknet": "Starknet"}

EVM_STANDARD = frozenset({
    "web3_clientVersion", "web3_sha3", "net_version", "net_listening", "net_peerCount",
    "eth_chainId", "eth_blockNumber", "eth_syncing", "eth_protocolVersion",
    "eth_getBalance", "eth_getCode", "eth_getStorageAt", "eth_getTransactionCount",
    "eth_getProof", "eth_call", "eth_callMany", "eth_simulateV1", "eth_estimateGas",
    "eth_createAccessList", "eth_gasPrice", "eth_maxPriorityFeePerGas", "eth_feeHistory",
    "eth_blobBaseFee", "eth_getBlockByNumber", "eth_getBlockByHash", "eth_getBlockReceipts",
    "eth_getHeaderByNumber", "eth_getHeaderByHash",
    "eth_getBlockTransactionCountByHash", "eth_getBlockTransactionCountByNumber",
    "eth_getUncleCountByBlockHash", "eth_getUncleCountByBlockNumber",
    "eth_getUncleByBlockHashAndIndex", "eth_getUncleByBlockNumberAndIndex",
    "eth_getTransactionByHash", "eth_getTransactionByBlockHashAndIndex",
    "eth_getTransactionByBlockNumberAndIndex", "eth_getTransactionReceipt",
    "eth_getRawTransactionByHash", "eth_getLogs", "eth_sendRawTransaction",
    # ERC-4337 bundler methods
    "eth_sendUserOperation", "eth_estimateUserOperationGas", "eth_getUserOperationByHash",
    "eth_getUserOperationReceipt", "eth_supportedEntryPoints",
})
# Chain-family extensions of zkSync, Linea and Polygon PoS: read methods, standard tier.
EVM_STANDARD_PREFIXES = ("zks_", "linea_", "bor_")

EVM_DEBUG = frozenset({
    "debug_traceTransaction", "debug_traceCall", "debug_traceCallMany", "debug_traceBlock",
    "debug_traceBlockByNumber", "debug_traceBlockByHash", "debug_traceBadBlock",
    "debug_storageRangeAt", "debug_accountRange", "debug_getModifiedAccountsByNumber",
    "debug_getModifiedAccountsByHash", "debug_getRawBlock", "debug_getRawHeader",
    "debug_getRawReceipts", "debug_getRawTransaction", "debug_getBadBlocks",
    "debug_intermediateRoots",
})
EVM_ADVANCED = frozenset({"txpool_inspect", "txpool_status"})
EVM_ADVANCED_PREFIXES = ("trace_", "arbtrace_")
EVM_LARGE = frozenset({"trace_replayBlockTransactions", "trace_replayTransaction",
                       "txpool_content"})
EVM_LARGE_PREFIXES = ("arbtrace_replay",)

SOLANA_STANDARD = frozenset({
    "getAccountInfo", "getBalance", "getBlock", "getBlockCommitment", "getBlockHeight",
    "getBlockProduction", "getBlocks", "getBlocksWithLimit", "getBlockTime",
    "getClusterNodes", "getEpochInfo", "getEpochSchedule", "getFeeForMessage",
    "getFirstAvailableBlock", "getGenesisHash", "getHealth", "getHighestSnapshotSlot",
    "getIdentity", "getInflationGovernor", "getInflationRate", "getInflationReward",
    "getLatestBlockhash", "getLeaderSchedule", "getMaxRetransmitSlot",
    "getMaxShredInsertSlot", "getMinimumBalanceForRentExemption", "getMultipleAccounts",
    "getProgramAccounts", "getRecentPerformanceSamples", "getRecentPrioritizationFees",
    "getSignaturesForAddress", "getSignatureStatuses", "getSlot", "getSlotLeader",
    "getSlotLeaders", "getStakeMinimumDelegation", "getTokenAccountBalance",
    "getTokenAccountsByDelegate", "getTokenAccountsByOwner", "getTokenLargestAccounts",
    "getTokenSupply", "getTransaction", "getTransactionCount", "getVersion",
    "getVoteAccounts", "isBlockhashValid", "minimumLedgerSlot", "requestAirdrop",
    "sendTransaction", "simulateTransaction",
})
SOLANA_LARGE = frozenset({"getLargestAccounts", "getSupply"})

STARKNET_PREFIX = "starknet_"

# Stateful filters: their state is pinned to one backend of a load-balanced pool.
FILTER_METHODS = frozenset({
    "eth_newFilter", "eth_newBlockFilter", "eth_newPendingTransactionFilter",
    "eth_getFilterChanges", "eth_getFilterLogs", "eth_uninstallFilter",
})
# The node's keys, accounts and controls belong to the operator.
FORBIDDEN_METHODS = frozenset({
    "eth_sign", "eth_signTransaction", "eth_signTypedData", "eth_signTypedData_v1",
    "eth_signTypedData_v3", "eth_signTypedData_v4", "eth_sendTransaction", "eth_accounts",
    "eth_requestAccounts", "eth_coinbase", "eth_getWork", "eth_submitWork",
    "eth_submitHashrate",
})
FORBIDDEN_PREFIXES = ("personal_", "admin_", "miner_", "clique_", "engine_", "parity_",
                      "signer_", "wallet_", "debug_")  # debug_: all but EVM_DEBUG


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a method is not forwarded: `kind` is websocket, filter, forbidden, family or
    unmapped; `message` names the method and what to do instead."""

    method: str
    kind: str
    message: str


def is_websocket_only(method: str) -> bool:
    return (method in ("eth_subscribe", "eth_unsubscribe")
            or method.endswith(("Subscribe", "Unsubscribe"))
            or method.startswith(("starknet_subscribe", "starknet_unsubscribe")))


def _evm_tier(method: str) -> int | None:
    if method in EVM_LARGE or method.startswith(EVM_LARGE_PREFIXES):
        return LARGE
    if method in EVM_DEBUG or method in EVM_ADVANCED or method.startswith(EVM_ADVANCED_PREFIXES):
        return ADVANCED
    if method in EVM_STANDARD or method.startswith(EVM_STANDARD_PREFIXES):
        return STANDARD
    return None


def _solana_tier(method: str) -> int | None:
    if method in SOLANA_LARGE:
        return LARGE
    return STANDARD if method in SOLANA_STANDARD else None


def _starknet_tier(method: str) -> int | None:
    return STANDARD if method.startswith(STARKNET_PREFIX) and len(method) > 9 else None


_TIERS = {"evm": _evm_tier, "solana": _solana_tier, "starknet": _starknet_tier}


def _article(word: str) -> str:
    return "an" if word[:1] in "AEIOU" else "a"


def classify(method: str, family: Family, network: str) -> int | Refusal:
    """The tier (1, 2 or 4) of `method` on a network of `family`, or why it is refused."""
    if is_websocket_only(method):
        return Refusal(method, "websocket", f"{method} is WebSocket-only; this proxy is "
                                            "HTTP-only (poll with HTTP methods instead)")
    if method in FILTER_METHODS:
        return Refusal(method, "filter", f"{method} is a stateful filter method, which "
                                         "cannot work behind a load-balanced HTTP proxy; "
                                         "use eth_getLogs instead")
    if method in FORBIDDEN_METHODS or (method.startswith(FORBIDDEN_PREFIXES)
                                       and method not in EVM_DEBUG):
        return Refusal(method, "forbidden", f"{method} is not offered: signing, account and "
                                            "node-administration methods are refused")
    tier = _TIERS[family](method)
    if tier is not None:
        return tier
    for other, tier_of in _TIERS.items():
        if other != family and tier_of(method) is not None:
            theirs, ours = FAMILY_NAMES[other], FAMILY_NAMES[family]
            return Refusal(method, "family",
                           f"{method} is {_article(theirs)} {theirs} method; {network} is "
                           f"{_article(ours)} {ours} network")
    return Refusal(method, "unmapped", f"{method} is not a supported method on {network}")
