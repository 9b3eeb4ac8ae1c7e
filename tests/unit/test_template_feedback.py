"""template.yaml's SES feedback, read as data: the configuration set's SNS event
destination, the feedback function (in the VPC, least privilege, its own alarms),
the relay told about it, the reputation alarms and the dashboard's rates."""

from __future__ import annotations

from typing import Any

from support.template import TemplateModel

MODEL = TemplateModel(every_condition=True)
RESOURCES: dict[str, Any] = MODEL.resources
PARAMETERS: dict[str, Any] = MODEL.doc["Parameters"]
resolve = MODEL.resolve
SES_EVENT_TYPES = ["send", "delivery", "bounce", "complaint", "reject", "renderingFailure", "deliveryDelay"]


def _statements(function: str) -> list[dict[str, Any]]:
    out = []
    for policy in RESOURCES[function]["Properties"]["Policies"]:
        if isinstance(policy, dict) and "Statement" in policy:
            for s in policy["Statement"]:
                if "Fn::If" in s:
                    s = s["Fn::If"][1]
                out.append(s)
    return out


def test_the_configuration_set_publishes_every_event_type_to_an_encrypted_topic_only_it_may_publish_to():
    destination = RESOURCES["SesFeedbackDestination"]["Properties"]
    assert destination["ConfigurationSetName"] == {"Ref": "SesConfigurationSet"}
    event = destination["EventDestination"]
    assert event["MatchingEventTypes"] == SES_EVENT_TYPES and event["Enabled"] is True
    assert event["SnsDestination"] == {"TopicARN": {"Ref": "SesFeedbackTopic"}}
    topic = RESOURCES["SesFeedbackTopic"]["Properties"]
    assert topic["KmsMasterKeyId"] == {"Fn::GetAtt": ["SesFeedbackTopicKey", "Arn"]}
    [allow, deny] = RESOURCES["SesFeedbackTopicPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert allow["Principal"] == {"Service": "ses.amazonaws.com"} and allow["Action"] == "sns:Publish"
    assert resolve(allow["Condition"]["ArnLike"]["aws:SourceArn"]).endswith(
        ":configuration-set/<SesConfigurationSet>")
    assert deny["Effect"] == "Deny"


def test_feedback_is_deployed_only_with_ses_a_configuration_set_and_feedback_enabled():
    ses = {"SesSenderIdentity": "example.com"}
    assert not TemplateModel(ses).deployed("FeedbackFunction")
    assert TemplateModel({**ses, "SesConfigurationSet": "tx"}).deployed("FeedbackFunction")
    assert not TemplateModel({**ses, "SesConfigurationSet": "tx", "SesFeedback": "disabled"}).deployed(
        "FeedbackFunction")
    for name, resource in RESOURCES.items():
        if name.startswith(("SesFeedback", "Feedback", "SesAddressKey", "SesBounce", "SesComplaint")):
            assert resource["Condition"] == "SesFeedbackEnabled", name


def test_the_feedback_function_runs_on_the_topic_in_the_vpc_with_least_privilege():
    props = RESOURCES["FeedbackFunction"]["Properties"]
    assert props["CodeUri"] == "functions/feedback/" and props["Handler"] == "app.handler"
    assert "VpcConfig" not in props  # the Globals' VPC, as every function
    assert props["Events"]["SesEvents"] == {"Type": "SNS", "Properties": {"Topic": {"Ref": "SesFeedbackTopic"}}}
    assert {"Ref": "DatabaseAccessPolicy"} in props["Policies"]
    granted = {(s["Action"], str(s["Resource"])) for s in _statements("FeedbackFunction")}
    assert granted == {("secretsmanager:GetSecretValue", "{'Ref': 'SesAddressKey'}"),
                       ("sqs:SendMessage", "{'Fn::GetAtt': ['SesFeedbackDeadLetterQueue', 'Arn']}")}
    env = props["Environment"]["Variables"]
    assert env["OUTBOX_SES_ADDRESS_KEY_SECRET_ARN"] == {"Ref": "SesAddressKey"}
    assert env["OUTBOX_SES_SUPPRESSION"] == {"Ref": "SesSuppression"}
    retries = props["EventInvokeConfig"]
    assert retries["DestinationConfig"]["OnFailure"]["Destination"] == {
        "Fn::GetAtt": ["SesFeedbackDeadLetterQueue", "Arn"]}
    log = RESOURCES[props["LoggingConfig"]["LogGroup"]["Ref"]]["Properties"]
    assert log["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_the_relay_is_told_about_feedback_and_may_read_only_the_key():
    env = RESOURCES["RelaySesFunction"]["Properties"]["Environment"]["Variables"]
    assert env["OUTBOX_SES_FEEDBACK"] == {"Fn::If": ["SesFeedbackEnabled", "true", "false"]}
    assert env["OUTBOX_SES_SETTLE_SECONDS"] == {"Ref": "SesSettleSeconds"}
    assert env["OUTBOX_SES_SUPPRESSION"] == {"Fn::If": ["SesFeedbackEnabled", {"Ref": "SesSuppression"}, "false"]}
    assert env["OUTBOX_SES_ADDRESS_KEY_SECRET_ARN"] == {"Fn::If": ["SesFeedbackEnabled", {"Ref": "SesAddressKey"}, ""]}
    secrets = [s for s in _statements("RelaySesFunction") if s.get("Action") == "secretsmanager:GetSecretValue"]
    assert [s["Resource"] for s in secrets] == [{"Ref": "SesAddressKey"}]


def test_the_feedback_function_has_its_own_alarms():
    alarms = {name: a["Properties"] for name, a in MODEL.of_type("AWS::CloudWatch::Alarm").items()}
    on_function = {p["MetricName"] for p in alarms.values()
                   if p.get("Dimensions") == [{"Name": "FunctionName", "Value": {"Ref": "FeedbackFunction"}}]}
    assert on_function == {"Errors", "Throttles"}
    assert alarms["FeedbackRefusedAlarm"]["MetricName"] == "FeedbackRefused"
    assert alarms["FeedbackDeadLetterAlarm"]["Namespace"] == "AWS/SQS"


def test_reputation_alarms_fire_below_the_review_thresholds_given_as_parameters():
    assert (PARAMETERS["SesBounceRateAlarmPercent"]["Default"], PARAMETERS["SesComplaintRateAlarmPercent"]["Default"]) \
        == (4, 0.08)
    for alarm, parameter, metric in (("SesBounceRateAlarm", "SesBounceRateAlarmPercent", "EmailBounced"),
                                     ("SesComplaintRateAlarm", "SesComplaintRateAlarmPercent", "EmailComplained")):
        props = RESOURCES[alarm]["Properties"]
        assert props["Threshold"] == {"Ref": parameter}
        stats = {q["Id"]: q["MetricStat"] for q in props["Metrics"] if "MetricStat" in q}
        assert {s["Metric"]["MetricName"] for s in stats.values()} == {"EmailSent", metric}
        for s in stats.values():
            assert {"Name": "configuration_set", "Value": {"Ref": "SesConfigurationSet"}} in s["Metric"]["Dimensions"]
        [expression] = [q for q in props["Metrics"] if "Expression" in q]
        assert "SesReputationMinimumSends" in expression["Expression"]["Fn::Sub"]


def test_the_dashboard_plots_the_rates_and_the_feedback():
    series = MODEL.dashboard_series()
    plotted = {name for _, name, dims in series if dims.get("configuration_set") == "<SesConfigurationSet>"}
    assert plotted == {"EmailSent", "EmailBounced", "EmailComplained"}
    assert {"FeedbackRecorded", "FeedbackRefused", "FeedbackSettled"} <= {name for _, name, _ in series}
