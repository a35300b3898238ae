"""Generated from protos/echelon/v1 by `make proto`; do not edit.

The wire tag of every field (field number << 3 | wire type), for the encoders that write
protobuf bytes by hand: `echelon.contract.wire.varint(tag)` is the tag's bytes.
"""


class Value:  # common.proto
    int_value = 0x08  # 1, varint
    float_value = 0x11  # 2, 64-bit
    string_value = 0x1a  # 3, length-delimited


class AttributeSpec:  # common.proto
    name = 0x0a  # 1, length-delimited
    type = 0x10  # 2, varint
    min = 0x19  # 3, 64-bit
    max = 0x21  # 4, 64-bit
    max_length = 0x28  # 5, varint


class Schema:  # common.proto
    attributes = 0x0a  # 1, length-delimited
    max_attribute_bytes = 0x10  # 2, varint


class Topic:  # common.proto
    name = 0x0a  # 1, length-delimited
    schema = 0x12  # 2, length-delimited
    created_unix_ms = 0x18  # 3, varint
    retention_bytes = 0x140  # 40, varint
    retention_seconds = 0x148  # 41, varint
    durable_caps = 0x1f2  # 62, length-delimited


class DurableCaps:  # common.proto
    max_messages = 0x08  # 1, varint
    max_bytes = 0x10  # 2, varint
    idle_seconds = 0x18  # 3, varint
    replicas = 0x20  # 4, varint


class Predicate:  # common.proto
    attribute = 0x0a  # 1, length-delimited
    op = 0x10  # 2, varint
    value = 0x1a  # 3, length-delimited
    upper = 0x22  # 4, length-delimited


class Filter:  # common.proto
    predicates = 0x0a  # 1, length-delimited
    any_of = 0x152  # 42, length-delimited


class MessageId:  # common.proto
    producer_id = 0x0a  # 1, length-delimited
    sequence = 0x10  # 2, varint


class Event:  # common.proto
    id = 0x0a  # 1, length-delimited
    topic = 0x12  # 2, length-delimited
    attributes = 0x1a  # 3, length-delimited
    payload = 0x22  # 4, length-delimited
    ordering_key = 0x2a  # 5, length-delimited
    publish_time_unix_nanos = 0x30  # 6, varint

    class AttributesEntry:
        key = 0x0a  # 1, length-delimited
        value = 0x12  # 2, length-delimited


class AclRule:  # common.proto
    principal = 0x0a  # 1, length-delimited
    pattern = 0x12  # 2, length-delimited
    rights = 0x1a  # 3, length-delimited
    caps = 0x192  # 50, length-delimited


class IdentityCaps:  # common.proto
    subscriptions = 0x08  # 1, varint
    durable_subscriptions = 0x10  # 2, varint
    durable_max_messages = 0x18  # 3, varint
    durable_max_bytes = 0x20  # 4, varint
    durable_max_idle_seconds = 0x28  # 5, varint
    durable_max_replicas = 0x30  # 6, varint


class CrawlStepRequest:  # crawl.proto
    role = 0x08  # 1, varint


class CrawlStepResponse:  # crawl.proto
    holders = 0x0a  # 1, length-delimited
    neighbours = 0x12  # 2, length-delimited
    view_age_seconds = 0x19  # 3, 64-bit


class DurableSubscription:  # durable.proto
    name = 0x0a  # 1, length-delimited
    topic = 0x12  # 2, length-delimited
    filter = 0x1a  # 3, length-delimited
    options = 0x22  # 4, length-delimited
    holders = 0x2a  # 5, length-delimited
    created_unix_nanos = 0x30  # 6, varint
    last_active_unix_nanos = 0x38  # 7, varint
    backlog_messages = 0x40  # 8, varint
    backlog_bytes = 0x48  # 9, varint
    oldest_unacked_unix_nanos = 0x50  # 10, varint
    dropped = 0x58  # 11, varint
    attached = 0x60  # 12, varint
    answered_by = 0x6a  # 13, length-delimited
    seeks = 0x70  # 14, varint
    redelivery = 0x7a  # 15, length-delimited


class ListSubscriptionsRequest:  # durable.proto
    local = 0x08  # 1, varint
    owner = 0x192  # 50, length-delimited


class ListSubscriptionsResponse:  # durable.proto
    subscriptions = 0x0a  # 1, length-delimited


class GetSubscriptionRequest:  # durable.proto
    name = 0x0a  # 1, length-delimited
    local = 0x10  # 2, varint


class SeekRequest:  # durable.proto
    name = 0x0a  # 1, length-delimited
    time_unix_nanos = 0x10  # 2, varint
    message = 0x1a  # 3, length-delimited
    local = 0x20  # 4, varint


class SeekResponse:  # durable.proto
    backlog_messages = 0x08  # 1, varint


class DeleteSubscriptionRequest:  # durable.proto
    name = 0x0a  # 1, length-delimited
    local = 0x10  # 2, varint


class DeleteSubscriptionResponse:  # durable.proto
    pass


class DurableChange:  # durable.proto
    name = 0x0a  # 1, length-delimited
    create = 0x12  # 2, length-delimited
    acks = 0x1a  # 3, length-delimited
    seek = 0x22  # 4, length-delimited
    delete = 0x28  # 5, varint
    touch_unix_nanos = 0x30  # 6, varint
    full = 0x3a  # 7, length-delimited


class BacklogFull:  # durable.proto
    topic = 0x0a  # 1, length-delimited
    filter = 0x12  # 2, length-delimited
    full = 0x18  # 3, varint


class DurableAcks:  # durable.proto
    ids = 0x0a  # 1, length-delimited


class ApplyResponse:  # durable.proto
    pass


class FetchRequest:  # durable.proto
    name = 0x0a  # 1, length-delimited


class DurableState:  # durable.proto
    record = 0x0a  # 1, length-delimited
    backlog = 0x12  # 2, length-delimited
    sender_started_unix_nanos = 0x18  # 3, varint
    acked = 0x22  # 4, length-delimited


class Subscription:  # matcher.proto
    id = 0x0a  # 1, length-delimited
    agent = 0x12  # 2, length-delimited
    topic = 0x1a  # 3, length-delimited
    filter = 0x22  # 4, length-delimited
    version = 0x28  # 5, varint


class RegisterRequest:  # matcher.proto
    subscriptions = 0x0a  # 1, length-delimited
    refill = 0x12  # 2, length-delimited


class RegisterResponse:  # matcher.proto
    registered = 0x08  # 1, varint


class RemoveRequest:  # matcher.proto
    ids = 0x0a  # 1, length-delimited
    version = 0x10  # 2, varint


class RemoveResponse:  # matcher.proto
    removed = 0x08  # 1, varint


class MatchRequest:  # matcher.proto
    batch_id = 0x08  # 1, varint
    events = 0x12  # 2, length-delimited
    agents_only = 0x320  # 100, varint
    topic = 0x32a  # 101, length-delimited
    layout = 0x332  # 102, length-delimited
    zones = 0x33a  # 103, length-delimited
    zstd = 0x5f2  # 190, length-delimited


class AgentMatches:  # matcher.proto
    agent = 0x0a  # 1, length-delimited
    subscriptions = 0x12  # 2, length-delimited


class MatchResult:  # matcher.proto
    agents = 0x0a  # 1, length-delimited


class MatchResponse:  # matcher.proto
    batch_id = 0x08  # 1, varint
    results = 0x12  # 2, length-delimited
    stale = 0x322  # 100, length-delimited
    entry = 0x32a  # 101, length-delimited
    zstd = 0x5f2  # 190, length-delimited


class StoreRequest:  # matcher.proto
    sender = 0x0a  # 1, length-delimited
    topic = 0x12  # 2, length-delimited
    layouts = 0x1a  # 3, length-delimited
    subscriptions = 0x22  # 4, length-delimited


class StoreResponse:  # matcher.proto
    stored = 0x08  # 1, varint


class DropRequest:  # matcher.proto
    sender = 0x0a  # 1, length-delimited
    ids = 0x12  # 2, length-delimited
    versions = 0x1a  # 3, length-delimited
    sent_to = 0x22  # 4, length-delimited


class DropResponse:  # matcher.proto
    removed = 0x0a  # 1, length-delimited


class ZoneEvents:  # matcher.proto
    zone = 0x0a  # 1, length-delimited
    events = 0x12  # 2, length-delimited


class LayoutStatus:  # matcher.proto
    topic = 0x0a  # 1, length-delimited
    adopted = 0x12  # 2, length-delimited
    pushed = 0x18  # 3, varint
    filled = 0x20  # 4, varint
    active = 0x2a  # 5, length-delimited
    complete = 0x30  # 6, varint


class SyncRequest:  # matcher.proto
    member = 0x0a  # 1, length-delimited
    incarnation = 0x10  # 2, varint
    seq = 0x18  # 3, varint
    layouts = 0x22  # 4, length-delimited


class SyncResponse:  # matcher.proto
    empty = 0x462  # 140, length-delimited
    lease_ms = 0x468  # 141, varint


class ListZonesRequest:  # matcher.proto
    topic = 0x0a  # 1, length-delimited


class ZoneInfo:  # matcher.proto
    topic = 0x0a  # 1, length-delimited
    id = 0x12  # 2, length-delimited
    low = 0x1a  # 3, length-delimited
    high = 0x22  # 4, length-delimited
    members = 0x2a  # 5, length-delimited
    subscriptions = 0x30  # 6, varint
    mirrors = 0x38  # 7, varint


class TopicLayout:  # matcher.proto
    topic = 0x0a  # 1, length-delimited
    active = 0x12  # 2, length-delimited
    pending = 0x1a  # 3, length-delimited
    source = 0x22  # 4, length-delimited
    zones = 0x2a  # 5, length-delimited


class ListZonesResponse:  # matcher.proto
    member = 0x0a  # 1, length-delimited
    copies = 0x10  # 2, varint
    topics = 0x1a  # 3, length-delimited


class Holding:  # matcher.proto
    id = 0x0a  # 1, length-delimited
    version = 0x10  # 2, varint


class ReconcileRequest:  # matcher.proto
    agent = 0x0a  # 1, length-delimited
    digests = 0x12  # 2, length-delimited


class ReconcileResponse:  # matcher.proto
    buckets = 0x0a  # 1, length-delimited
    holdings = 0x12  # 2, length-delimited
    matchers = 0x18  # 3, varint


class HoldingsRequest:  # matcher.proto
    agent = 0x0a  # 1, length-delimited


class HoldingsResponse:  # matcher.proto
    holdings = 0x0a  # 1, length-delimited


class SampleRequest:  # matcher.proto
    topic = 0x0a  # 1, length-delimited
    max_points = 0x10  # 2, varint


class PointSample:  # matcher.proto
    zone = 0x0a  # 1, length-delimited
    total = 0x10  # 2, varint
    coordinates = 0x1a  # 3, length-delimited


class TopicSample:  # matcher.proto
    topic = 0x0a  # 1, length-delimited
    dims = 0x10  # 2, varint
    layout = 0x1a  # 3, length-delimited
    source = 0x22  # 4, length-delimited
    subscriptions = 0x2a  # 5, length-delimited
    events = 0x32  # 6, length-delimited


class SampleResponse:  # matcher.proto
    member = 0x0a  # 1, length-delimited
    topics = 0x12  # 2, length-delimited


class ZoneRef:  # matcher.proto
    topic = 0x0a  # 1, length-delimited
    layout = 0x12  # 2, length-delimited
    zone = 0x1a  # 3, length-delimited


class RevokeRequest:  # matcher.proto
    sender = 0x0a  # 1, length-delimited
    zones = 0x12  # 2, length-delimited


class RevokeResponse:  # matcher.proto
    pass


class Member:  # membership.proto
    id = 0x0a  # 1, length-delimited
    role = 0x10  # 2, varint
    address = 0x1a  # 3, length-delimited
    region = 0x22  # 4, length-delimited
    capacity = 0x28  # 5, varint
    incarnation = 0x30  # 6, varint
    state = 0x38  # 7, varint
    publishes = 0x42  # 8, length-delimited
    subscribes = 0x4a  # 9, length-delimited
    last_beat_unix_ms = 0x50  # 10, varint
    metrics_address = 0x5a  # 11, length-delimited


class View:  # membership.proto
    version = 0x08  # 1, varint
    members = 0x12  # 2, length-delimited
    topics = 0x1a  # 3, length-delimited
    acls = 0x192  # 50, length-delimited


class ViewDelta:  # membership.proto
    from_version = 0x08  # 1, varint
    version = 0x10  # 2, varint
    upserted = 0x1a  # 3, length-delimited
    topics_upserted = 0x22  # 4, length-delimited
    topics_deleted = 0x2a  # 5, length-delimited
    removed = 0x32  # 6, length-delimited
    acls_upserted = 0x192  # 50, length-delimited
    acls_deleted = 0x19a  # 51, length-delimited


class ViewUpdate:  # membership.proto
    snapshot = 0x0a  # 1, length-delimited
    delta = 0x12  # 2, length-delimited
    keepalive = 0x18  # 3, varint


class JoinRequest:  # membership.proto
    member = 0x0a  # 1, length-delimited


class JoinResponse:  # membership.proto
    view = 0x0a  # 1, length-delimited
    heartbeat_interval_ms = 0x10  # 2, varint


class Beat:  # membership.proto
    member_id = 0x0a  # 1, length-delimited
    incarnation = 0x10  # 2, varint
    has_topics = 0x18  # 3, varint
    publishes = 0x22  # 4, length-delimited
    subscribes = 0x2a  # 5, length-delimited


class BeatReply:  # membership.proto
    state = 0x08  # 1, varint
    incarnation = 0x10  # 2, varint
    view_version = 0x18  # 3, varint


class WatchRequest:  # membership.proto
    member_id = 0x0a  # 1, length-delimited
    known_version = 0x10  # 2, varint


class LeaveRequest:  # membership.proto
    member_id = 0x0a  # 1, length-delimited
    incarnation = 0x10  # 2, varint


class LeaveResponse:  # membership.proto
    pass


class SuspectRequest:  # membership.proto
    reporter = 0x0a  # 1, length-delimited
    member_id = 0x12  # 2, length-delimited
    incarnation = 0x18  # 3, varint
    reason = 0x22  # 4, length-delimited


class SuspectResponse:  # membership.proto
    pass


class RunReport:  # membership.proto
    result = 0x0a  # 1, length-delimited
    reason = 0x12  # 2, length-delimited


class ReportRunResponse:  # membership.proto
    pass


class Zone:  # membership.proto
    id = 0x0a  # 1, length-delimited
    topic = 0x12  # 2, length-delimited
    low = 0x1a  # 3, length-delimited
    high = 0x22  # 4, length-delimited
    owner = 0x2a  # 5, length-delimited
    replicas = 0x32  # 6, length-delimited


class Clique:  # membership.proto
    id = 0x0a  # 1, length-delimited
    members = 0x12  # 2, length-delimited


class BucketHint:  # membership.proto
    member_id = 0x0a  # 1, length-delimited
    weight = 0x11  # 2, 64-bit


class RoutingPlan:  # membership.proto
    version = 0x08  # 1, varint
    epoch = 0x10  # 2, varint
    zones = 0x1a  # 3, length-delimited
    cliques = 0x22  # 4, length-delimited
    bucket_hints = 0x2a  # 5, length-delimited
    origin = 0x32  # 6, length-delimited
    created_unix_ms = 0x38  # 7, varint
    predicted_gain = 0x41  # 8, 64-bit


class GetPlanRequest:  # membership.proto
    pass


class WatchPlanRequest:  # membership.proto
    known_version = 0x08  # 1, varint


class PushPlanResponse:  # membership.proto
    version = 0x08  # 1, varint


class Stamp:  # membership.proto
    version = 0x08  # 1, varint
    origin = 0x12  # 2, length-delimited


class TopicEntry:  # membership.proto
    name = 0x0a  # 1, length-delimited
    stamp = 0x12  # 2, length-delimited
    topic = 0x1a  # 3, length-delimited
    deleted = 0x20  # 4, varint


class PlanEntry:  # membership.proto
    stamp = 0x0a  # 1, length-delimited
    plan = 0x12  # 2, length-delimited


class ReplicaState:  # membership.proto
    origin = 0x0a  # 1, length-delimited
    topics = 0x12  # 2, length-delimited
    plan = 0x1a  # 3, length-delimited
    acls = 0x192  # 50, length-delimited


class AclEntry:  # membership.proto
    key = 0x0a  # 1, length-delimited
    stamp = 0x12  # 2, length-delimited
    rule = 0x1a  # 3, length-delimited
    deleted = 0x20  # 4, varint


class DigestRequest:  # membership.proto
    origin = 0x0a  # 1, length-delimited


class DigestResponse:  # membership.proto
    origin = 0x0a  # 1, length-delimited
    topics = 0x12  # 2, length-delimited
    plan = 0x1a  # 3, length-delimited
    acls = 0x192  # 50, length-delimited


class PullRequest:  # membership.proto
    origin = 0x0a  # 1, length-delimited


class PushResponse:  # membership.proto
    pass


class PublishRequest:  # pubsub.proto
    topic = 0x0a  # 1, length-delimited
    attributes = 0x12  # 2, length-delimited
    payload = 0x1a  # 3, length-delimited
    ordering_key = 0x22  # 4, length-delimited
    producer_id = 0x2a  # 5, length-delimited
    sequence = 0x30  # 6, varint
    ack_level = 0x38  # 7, varint
    slice_index = 0x40  # 8, varint
    slice_count = 0x48  # 9, varint
    payload_size = 0x50  # 10, varint
    batch = 0xa2  # 20, length-delimited
    coalesce_acks = 0x3c0  # 120, varint
    zstd = 0x5f2  # 190, length-delimited
    lean_acks = 0x3c8  # 121, varint

    class AttributesEntry:
        key = 0x0a  # 1, length-delimited
        value = 0x12  # 2, length-delimited


class PublishAck:  # pubsub.proto
    producer_id = 0x0a  # 1, length-delimited
    sequence = 0x10  # 2, varint
    code = 0x18  # 3, varint
    error = 0x22  # 4, length-delimited
    destinations = 0x28  # 5, varint
    duplicate = 0x30  # 6, varint
    acks = 0xa2  # 20, length-delimited
    stream_status = 0x190  # 50, varint
    zstd = 0x5f2  # 190, length-delimited


class SubscribeRequest:  # pubsub.proto
    open = 0x0a  # 1, length-delimited
    ack = 0x12  # 2, length-delimited
    nack = 0x1a  # 3, length-delimited
    in_progress = 0x22  # 4, length-delimited
    term = 0x2a  # 5, length-delimited
    close = 0x37a  # 111, length-delimited
    batch = 0x372  # 110, length-delimited


class SubscriptionOpen:  # pubsub.proto
    topic = 0x0a  # 1, length-delimited
    filter = 0x12  # 2, length-delimited
    filter_text = 0x1a  # 3, length-delimited
    subscription = 0x22  # 4, length-delimited
    credits = 0x28  # 5, varint
    batched_deliveries = 0x30  # 6, varint
    durable = 0x142  # 40, length-delimited
    routed = 0x148  # 41, varint
    sid = 0x370  # 110, varint
    encoded_events = 0x550  # 170, varint
    evict = 0x5a8  # 181, varint
    redelivery = 0x5f2  # 190, length-delimited


class RedeliveryPolicy:  # pubsub.proto
    ack_deadline_ms = 0x08  # 1, varint
    no_ack_deadline = 0x10  # 2, varint
    max_deliveries = 0x18  # 3, varint
    dead_letter_topic = 0x22  # 4, length-delimited


class SubscriberAck:  # pubsub.proto
    delivery_ids = 0x0a  # 1, length-delimited
    credits = 0x10  # 2, varint
    through = 0xa0  # 20, varint
    sid = 0x370  # 110, varint


class SubscriberProgress:  # pubsub.proto
    delivery_ids = 0x0a  # 1, length-delimited
    sid = 0x370  # 110, varint


class SubscriberTerm:  # pubsub.proto
    delivery_ids = 0x0a  # 1, length-delimited
    credits = 0x10  # 2, varint
    sid = 0x370  # 110, varint


class SubscriberNack:  # pubsub.proto
    delivery_ids = 0x0a  # 1, length-delimited
    delay_ms = 0x10  # 2, varint
    credits = 0x18  # 3, varint
    sid = 0x370  # 110, varint


class Delivery:  # pubsub.proto
    delivery_id = 0x08  # 1, varint
    subscription = 0x12  # 2, length-delimited
    event = 0x1a  # 3, length-delimited
    redelivery_count = 0x20  # 4, varint
    batch = 0xa2  # 20, length-delimited
    chunked = 0xf0  # 30, varint
    payload_size = 0xf8  # 31, varint
    chunk = 0x102  # 32, length-delimited
    chunk_offset = 0x108  # 33, varint
    last = 0x110  # 34, varint
    aborted = 0x11a  # 35, length-delimited
    sid = 0x370  # 110, varint
    opened = 0x37a  # 111, length-delimited
    code = 0x380  # 112, varint
    error = 0x38a  # 113, length-delimited
    encoded_event = 0x552  # 170, length-delimited
    zstd = 0x5f2  # 190, length-delimited


class UnsubscribeRequest:  # pubsub.proto
    subscription = 0x0a  # 1, length-delimited


class UnsubscribeResponse:  # pubsub.proto
    pass


class CapsRequest:  # pubsub.proto
    principal = 0x0a  # 1, length-delimited
    caps = 0x12  # 2, length-delimited
    clear = 0x1a  # 3, length-delimited


class CreateTopicRequest:  # pubsub.proto
    name = 0x0a  # 1, length-delimited
    schema = 0x12  # 2, length-delimited
    retention_bytes = 0x140  # 40, varint
    retention_seconds = 0x148  # 41, varint
    durable_caps = 0x1f2  # 62, length-delimited


class GetTopicRequest:  # pubsub.proto
    name = 0x0a  # 1, length-delimited


class ListTopicsRequest:  # pubsub.proto
    pass


class ListTopicsResponse:  # pubsub.proto
    topics = 0x0a  # 1, length-delimited


class DeleteTopicRequest:  # pubsub.proto
    name = 0x0a  # 1, length-delimited


class DeleteTopicResponse:  # pubsub.proto
    pass


class DurableOptions:  # pubsub.proto
    start = 0x08  # 1, varint
    max_messages = 0x10  # 2, varint
    max_bytes = 0x18  # 3, varint
    policy = 0x20  # 4, varint
    idle_seconds = 0x28  # 5, varint
    replicas = 0x30  # 6, varint


class AclRequest:  # pubsub.proto
    rule = 0x0a  # 1, length-delimited


class ListAclsRequest:  # pubsub.proto
    pass


class ListAclsResponse:  # pubsub.proto
    rules = 0x0a  # 1, length-delimited


class SubscriptionClose:  # pubsub.proto
    sid = 0x08  # 1, varint


class DeliveryRead:  # pubsub.proto
    delivery_id = 0x08  # 1, varint
    subscription = 0x12  # 2, length-delimited
    event = 0x1a  # 3, length-delimited
    redelivery_count = 0x20  # 4, varint
    batch = 0xa2  # 20, length-delimited
    chunked = 0xf0  # 30, varint
    payload_size = 0xf8  # 31, varint
    chunk = 0x102  # 32, length-delimited
    chunk_offset = 0x108  # 33, varint
    last = 0x110  # 34, varint
    aborted = 0x11a  # 35, length-delimited
    sid = 0x370  # 110, varint
    opened = 0x37a  # 111, length-delimited
    code = 0x380  # 112, varint
    error = 0x38a  # 113, length-delimited
    encoded_event = 0x552  # 170, length-delimited
    zstd = 0x5f2  # 190, length-delimited


class RelayFrame:  # relay.proto
    seq = 0x08  # 1, varint
    source = 0x12  # 2, length-delimited
    messages = 0x1a  # 3, length-delimited
    source_key = 0x22  # 4, length-delimited
    ack_may_wait = 0x3c0  # 120, varint
    zstd = 0x5f2  # 190, length-delimited


class RelayMessage:  # relay.proto
    event = 0x0a  # 1, length-delimited
    destinations = 0x12  # 2, length-delimited
    slice_index = 0x18  # 3, varint
    slice_count = 0x20  # 4, varint
    payload_size = 0x28  # 5, varint
    stripe = 0x30  # 6, varint
    aborted = 0xf0  # 30, varint
    encoded_event = 0x3c2  # 120, length-delimited


class RelayAck:  # relay.proto
    seqs = 0x0a  # 1, length-delimited


class Advertisement:  # router.proto
    topic = 0x0a  # 1, length-delimited
    bounds = 0x12  # 2, length-delimited


class Subgroup:  # router.proto
    topic = 0x0a  # 1, length-delimited
    filter = 0x12  # 2, length-delimited


class ControlMessage:  # router.proto
    kind = 0x08  # 1, varint
    sender = 0x12  # 2, length-delimited
    region = 0x1a  # 3, length-delimited
    subscriptions = 0x22  # 4, length-delimited
    ids = 0x2a  # 5, length-delimited
    subgroups = 0x32  # 6, length-delimited
    full = 0x38  # 7, varint
    last = 0x40  # 8, varint
    complete = 0x48  # 9, varint
    advertisements = 0x52  # 10, length-delimited


class ControlReply:  # router.proto
    pass


class DescribeRequest:  # router.proto
    pass


class LinkStatus:  # router.proto
    peer = 0x0a  # 1, length-delimited
    kind = 0x12  # 2, length-delimited
    queue_length = 0x18  # 3, varint
    congestion_element = 0x21  # 4, 64-bit
    congested = 0x28  # 5, varint


class DescribeResponse:  # router.proto
    router_id = 0x0a  # 1, length-delimited
    region = 0x12  # 2, length-delimited
    position = 0x18  # 3, varint
    region_index = 0x20  # 4, varint
    regions = 0x2a  # 5, length-delimited
    routing = 0x32  # 6, length-delimited
    links = 0x3a  # 7, length-delimited
    subgroups = 0x40  # 8, varint
    complete = 0x48  # 9, varint
    summaries = 0x52  # 10, length-delimited
    advertisements = 0x58  # 11, varint
    srt = 0x60  # 12, varint
    control_sent = 0x6a  # 13, length-delimited
    control = 0x72  # 14, length-delimited
    control_applied_ns = 0x78  # 15, varint
    advertisement_applied_ns = 0x80  # 16, varint

    class ControlSentEntry:
        key = 0x0a  # 1, length-delimited
        value = 0x10  # 2, varint


class RegionSummary:  # router.proto
    region = 0x0a  # 1, length-delimited
    complete = 0x10  # 2, varint
    subgroups = 0x18  # 3, varint
    answered = 0x20  # 4, varint
