import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PlaceGroupRequest(_message.Message):
    __slots__ = ("namespace", "name")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class PlaceGroupReply(_message.Message):
    __slots__ = ("placed", "placement", "explanation")
    PLACED_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    placed: bool
    placement: Placement
    explanation: str
    def __init__(self, placed: _Optional[bool] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., explanation: _Optional[str] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("assignments", "domain", "path", "optimal", "gap", "objective")
    class AssignmentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OPTIMAL_FIELD_NUMBER: _ClassVar[int]
    GAP_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    assignments: _containers.ScalarMap[str, str]
    domain: str
    path: str
    optimal: bool
    gap: float
    objective: Objective
    def __init__(self, assignments: _Optional[_Mapping[str, str]] = ..., domain: _Optional[str] = ..., path: _Optional[str] = ..., optimal: _Optional[bool] = ..., gap: _Optional[float] = ..., objective: _Optional[_Union[Objective, _Mapping]] = ...) -> None: ...

class Objective(_message.Message):
    __slots__ = ("unplaced", "spread", "nodes", "stranded", "domain_free", "preference")
    UNPLACED_FIELD_NUMBER: _ClassVar[int]
    SPREAD_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    STRANDED_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FREE_FIELD_NUMBER: _ClassVar[int]
    PREFERENCE_FIELD_NUMBER: _ClassVar[int]
    unplaced: int
    spread: _containers.RepeatedScalarFieldContainer[int]
    nodes: int
    stranded: int
    domain_free: int
    preference: int
    def __init__(self, unplaced: _Optional[int] = ..., spread: _Optional[_Iterable[int]] = ..., nodes: _Optional[int] = ..., stranded: _Optional[int] = ..., domain_free: _Optional[int] = ..., preference: _Optional[int] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ("namespace", "name")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("namespace", "name", "state", "placement", "members_at_barrier", "expires_in_seconds")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_AT_BARRIER_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    state: str
    placement: Placement
    members_at_barrier: int
    expires_in_seconds: float
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., members_at_barrier: _Optional[int] = ..., expires_in_seconds: _Optional[float] = ...) -> None: ...

class ExplainGroupRequest(_message.Message):
    __slots__ = ("namespace", "name")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ExplainGroupReply(_message.Message):
    __slots__ = ("namespace", "name", "state", "explanation", "members_existing", "members_bound", "min_count", "owner_kind", "owner_name", "owner_level", "smallest_change", "members_finished", "composite", "composite_groups", "composite_how", "composite_why")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_EXISTING_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_BOUND_FIELD_NUMBER: _ClassVar[int]
    MIN_COUNT_FIELD_NUMBER: _ClassVar[int]
    OWNER_KIND_FIELD_NUMBER: _ClassVar[int]
    OWNER_NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_LEVEL_FIELD_NUMBER: _ClassVar[int]
    SMALLEST_CHANGE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    COMPOSITE_FIELD_NUMBER: _ClassVar[int]
    COMPOSITE_GROUPS_FIELD_NUMBER: _ClassVar[int]
    COMPOSITE_HOW_FIELD_NUMBER: _ClassVar[int]
    COMPOSITE_WHY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    state: str
    explanation: str
    members_existing: int
    members_bound: int
    min_count: int
    owner_kind: str
    owner_name: str
    owner_level: str
    smallest_change: str
    members_finished: int
    composite: str
    composite_groups: _containers.RepeatedScalarFieldContainer[str]
    composite_how: str
    composite_why: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., explanation: _Optional[str] = ..., members_existing: _Optional[int] = ..., members_bound: _Optional[int] = ..., min_count: _Optional[int] = ..., owner_kind: _Optional[str] = ..., owner_name: _Optional[str] = ..., owner_level: _Optional[str] = ..., smallest_change: _Optional[str] = ..., members_finished: _Optional[int] = ..., composite: _Optional[str] = ..., composite_groups: _Optional[_Iterable[str]] = ..., composite_how: _Optional[str] = ..., composite_why: _Optional[str] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class ListGroupsReply(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupSummary]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupSummary, _Mapping]]] = ...) -> None: ...

class GroupSummary(_message.Message):
    __slots__ = ("namespace", "name", "state", "policy", "min_count", "members_existing", "members_bound", "topology_key", "domain", "explanation", "members_finished")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MIN_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_EXISTING_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_BOUND_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_KEY_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    state: str
    policy: str
    min_count: int
    members_existing: int
    members_bound: int
    topology_key: str
    domain: str
    explanation: str
    members_finished: int
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., policy: _Optional[str] = ..., min_count: _Optional[int] = ..., members_existing: _Optional[int] = ..., members_bound: _Optional[int] = ..., topology_key: _Optional[str] = ..., domain: _Optional[str] = ..., explanation: _Optional[str] = ..., members_finished: _Optional[int] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("namespace", "name")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("group", "category", "kind", "payload_json", "time", "dropped")
    class Category(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CATEGORY_UNSPECIFIED: _ClassVar[Event.Category]
        CATEGORY_PLAN: _ClassVar[Event.Category]
        CATEGORY_BIND: _ClassVar[Event.Category]
        CATEGORY_PREEMPT: _ClassVar[Event.Category]
        CATEGORY_STATUS: _ClassVar[Event.Category]
    CATEGORY_UNSPECIFIED: Event.Category
    CATEGORY_PLAN: Event.Category
    CATEGORY_BIND: Event.Category
    CATEGORY_PREEMPT: Event.Category
    CATEGORY_STATUS: Event.Category
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    group: str
    category: Event.Category
    kind: str
    payload_json: str
    time: _timestamp_pb2.Timestamp
    dropped: int
    def __init__(self, group: _Optional[str] = ..., category: _Optional[_Union[Event.Category, str]] = ..., kind: _Optional[str] = ..., payload_json: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., dropped: _Optional[int] = ...) -> None: ...

class WhatIfRequest(_message.Message):
    __slots__ = ("objects_json", "namespace")
    OBJECTS_JSON_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    objects_json: _containers.RepeatedScalarFieldContainer[str]
    namespace: str
    def __init__(self, objects_json: _Optional[_Iterable[str]] = ..., namespace: _Optional[str] = ...) -> None: ...

class WhatIfReply(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[WhatIfGroup]
    def __init__(self, groups: _Optional[_Iterable[_Union[WhatIfGroup, _Mapping]]] = ...) -> None: ...

class WhatIfGroup(_message.Message):
    __slots__ = ("namespace", "name", "source", "verdict", "members", "min_count", "policy", "topology_key", "domain", "nodes", "path", "optimal", "gap", "victims", "pdb_violations", "explanation", "order", "waiting", "waiting_why", "running", "composite", "advice")
    class NodesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    MIN_COUNT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_KEY_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OPTIMAL_FIELD_NUMBER: _ClassVar[int]
    GAP_FIELD_NUMBER: _ClassVar[int]
    VICTIMS_FIELD_NUMBER: _ClassVar[int]
    PDB_VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    WAITING_WHY_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    COMPOSITE_FIELD_NUMBER: _ClassVar[int]
    ADVICE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    source: str
    verdict: str
    members: int
    min_count: int
    policy: str
    topology_key: str
    domain: str
    nodes: _containers.ScalarMap[str, str]
    path: str
    optimal: bool
    gap: float
    victims: _containers.RepeatedCompositeFieldContainer[WhatIfVictim]
    pdb_violations: int
    explanation: str
    order: int
    waiting: _containers.RepeatedScalarFieldContainer[str]
    waiting_why: str
    running: int
    composite: str
    advice: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., source: _Optional[str] = ..., verdict: _Optional[str] = ..., members: _Optional[int] = ..., min_count: _Optional[int] = ..., policy: _Optional[str] = ..., topology_key: _Optional[str] = ..., domain: _Optional[str] = ..., nodes: _Optional[_Mapping[str, str]] = ..., path: _Optional[str] = ..., optimal: _Optional[bool] = ..., gap: _Optional[float] = ..., victims: _Optional[_Iterable[_Union[WhatIfVictim, _Mapping]]] = ..., pdb_violations: _Optional[int] = ..., explanation: _Optional[str] = ..., order: _Optional[int] = ..., waiting: _Optional[_Iterable[str]] = ..., waiting_why: _Optional[str] = ..., running: _Optional[int] = ..., composite: _Optional[str] = ..., advice: _Optional[str] = ...) -> None: ...

class WhatIfVictim(_message.Message):
    __slots__ = ("pod", "priority", "unit")
    POD_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    pod: str
    priority: int
    unit: str
    def __init__(self, pod: _Optional[str] = ..., priority: _Optional[int] = ..., unit: _Optional[str] = ...) -> None: ...
