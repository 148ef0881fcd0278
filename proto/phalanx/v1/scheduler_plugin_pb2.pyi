from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ContractVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTRACT_VERSION_UNSPECIFIED: _ClassVar[ContractVersion]
    CONTRACT_VERSION_1: _ClassVar[ContractVersion]
CONTRACT_VERSION_UNSPECIFIED: ContractVersion
CONTRACT_VERSION_1: ContractVersion

class PlanForPodRequest(_message.Message):
    __slots__ = ("version", "pod_json")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    POD_JSON_FIELD_NUMBER: _ClassVar[int]
    version: ContractVersion
    pod_json: bytes
    def __init__(self, version: _Optional[_Union[ContractVersion, str]] = ..., pod_json: _Optional[bytes] = ...) -> None: ...

class PlanForPodReply(_message.Message):
    __slots__ = ("verdict", "node", "reason", "plan", "members_missing")
    class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        VERDICT_UNSPECIFIED: _ClassVar[PlanForPodReply.Verdict]
        PLANNED: _ClassVar[PlanForPodReply.Verdict]
        WAIT: _ClassVar[PlanForPodReply.Verdict]
        NOT_A_MEMBER: _ClassVar[PlanForPodReply.Verdict]
    VERDICT_UNSPECIFIED: PlanForPodReply.Verdict
    PLANNED: PlanForPodReply.Verdict
    WAIT: PlanForPodReply.Verdict
    NOT_A_MEMBER: PlanForPodReply.Verdict
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_MISSING_FIELD_NUMBER: _ClassVar[int]
    verdict: PlanForPodReply.Verdict
    node: str
    reason: str
    plan: GroupPlan
    members_missing: bool
    def __init__(self, verdict: _Optional[_Union[PlanForPodReply.Verdict, str]] = ..., node: _Optional[str] = ..., reason: _Optional[str] = ..., plan: _Optional[_Union[GroupPlan, _Mapping]] = ..., members_missing: _Optional[bool] = ...) -> None: ...

class GroupPlan(_message.Message):
    __slots__ = ("group", "id", "state", "assignments", "gang", "reserved", "trade_classes")
    class AssignmentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class TradeClassesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    GANG_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    TRADE_CLASSES_FIELD_NUMBER: _ClassVar[int]
    group: str
    id: int
    state: str
    assignments: _containers.ScalarMap[str, str]
    gang: bool
    reserved: _containers.RepeatedScalarFieldContainer[str]
    trade_classes: _containers.ScalarMap[str, int]
    def __init__(self, group: _Optional[str] = ..., id: _Optional[int] = ..., state: _Optional[str] = ..., assignments: _Optional[_Mapping[str, str]] = ..., gang: _Optional[bool] = ..., reserved: _Optional[_Iterable[str]] = ..., trade_classes: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ReportRejectionRequest(_message.Message):
    __slots__ = ("version", "pod_json", "node", "plugin", "reason")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    POD_JSON_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    version: ContractVersion
    pod_json: bytes
    node: str
    plugin: str
    reason: str
    def __init__(self, version: _Optional[_Union[ContractVersion, str]] = ..., pod_json: _Optional[bytes] = ..., node: _Optional[str] = ..., plugin: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReportRejectionReply(_message.Message):
    __slots__ = ("outcome", "node")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    outcome: str
    node: str
    def __init__(self, outcome: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("version", "pod_uid", "group", "node", "traded_with", "simulation")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    TRADED_WITH_FIELD_NUMBER: _ClassVar[int]
    SIMULATION_FIELD_NUMBER: _ClassVar[int]
    version: ContractVersion
    pod_uid: str
    group: str
    node: str
    traded_with: str
    simulation: bool
    def __init__(self, version: _Optional[_Union[ContractVersion, str]] = ..., pod_uid: _Optional[str] = ..., group: _Optional[str] = ..., node: _Optional[str] = ..., traded_with: _Optional[str] = ..., simulation: _Optional[bool] = ...) -> None: ...

class ReserveReply(_message.Message):
    __slots__ = ("ok", "reason")
    OK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    reason: str
    def __init__(self, ok: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class UnreserveRequest(_message.Message):
    __slots__ = ("version", "pod_uid", "group", "node", "reason")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    version: ContractVersion
    pod_uid: str
    group: str
    node: str
    reason: str
    def __init__(self, version: _Optional[_Union[ContractVersion, str]] = ..., pod_uid: _Optional[str] = ..., group: _Optional[str] = ..., node: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class UnreserveReply(_message.Message):
    __slots__ = ("reject_uids",)
    REJECT_UIDS_FIELD_NUMBER: _ClassVar[int]
    reject_uids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, reject_uids: _Optional[_Iterable[str]] = ...) -> None: ...

class PermitRequest(_message.Message):
    __slots__ = ("version", "pod_uid", "group", "node", "reserved_uids", "condition_by_scheduler", "reserved_nodes")
    class ReservedNodesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    RESERVED_UIDS_FIELD_NUMBER: _ClassVar[int]
    CONDITION_BY_SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    RESERVED_NODES_FIELD_NUMBER: _ClassVar[int]
    version: ContractVersion
    pod_uid: str
    group: str
    node: str
    reserved_uids: _containers.RepeatedScalarFieldContainer[str]
    condition_by_scheduler: bool
    reserved_nodes: _containers.ScalarMap[str, str]
    def __init__(self, version: _Optional[_Union[ContractVersion, str]] = ..., pod_uid: _Optional[str] = ..., group: _Optional[str] = ..., node: _Optional[str] = ..., reserved_uids: _Optional[_Iterable[str]] = ..., condition_by_scheduler: _Optional[bool] = ..., reserved_nodes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PermitReply(_message.Message):
    __slots__ = ("decision", "reason", "allow_uids", "wait_seconds")
    class Decision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DECISION_UNSPECIFIED: _ClassVar[PermitReply.Decision]
        ALLOW: _ClassVar[PermitReply.Decision]
        WAIT: _ClassVar[PermitReply.Decision]
        REJECT: _ClassVar[PermitReply.Decision]
    DECISION_UNSPECIFIED: PermitReply.Decision
    ALLOW: PermitReply.Decision
    WAIT: PermitReply.Decision
    REJECT: PermitReply.Decision
    DECISION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ALLOW_UIDS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    decision: PermitReply.Decision
    reason: str
    allow_uids: _containers.RepeatedScalarFieldContainer[str]
    wait_seconds: float
    def __init__(self, decision: _Optional[_Union[PermitReply.Decision, str]] = ..., reason: _Optional[str] = ..., allow_uids: _Optional[_Iterable[str]] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class WatchReservationsRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: ContractVersion
    def __init__(self, version: _Optional[_Union[ContractVersion, str]] = ...) -> None: ...

class NodeReservation(_message.Message):
    __slots__ = ("amounts",)
    class AmountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    AMOUNTS_FIELD_NUMBER: _ClassVar[int]
    amounts: _containers.ScalarMap[str, int]
    def __init__(self, amounts: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Reservations(_message.Message):
    __slots__ = ("version", "plans", "nodes", "waiting_groups", "reject_uids", "preempting_groups", "untried_groups")
    class NodesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: NodeReservation
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[NodeReservation, _Mapping]] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PLANS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    WAITING_GROUPS_FIELD_NUMBER: _ClassVar[int]
    REJECT_UIDS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTING_GROUPS_FIELD_NUMBER: _ClassVar[int]
    UNTRIED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    version: int
    plans: _containers.RepeatedCompositeFieldContainer[GroupPlan]
    nodes: _containers.MessageMap[str, NodeReservation]
    waiting_groups: _containers.RepeatedScalarFieldContainer[str]
    reject_uids: _containers.RepeatedScalarFieldContainer[str]
    preempting_groups: _containers.RepeatedScalarFieldContainer[str]
    untried_groups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[int] = ..., plans: _Optional[_Iterable[_Union[GroupPlan, _Mapping]]] = ..., nodes: _Optional[_Mapping[str, NodeReservation]] = ..., waiting_groups: _Optional[_Iterable[str]] = ..., reject_uids: _Optional[_Iterable[str]] = ..., preempting_groups: _Optional[_Iterable[str]] = ..., untried_groups: _Optional[_Iterable[str]] = ...) -> None: ...
