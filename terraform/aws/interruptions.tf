# The interruption queue (interruption_queue_url) and the EventBridge rules feeding it: the four
# event kinds of REFERENCE.md that providers/src/aws.rs routes on (source, detail-type).
# terraform/tests/test_modules.py checks these patterns against aws.rs, so the two cannot drift.

locals {
  interruption_events = {
    spot-interruption = {
      description = "EC2 Spot Instance Interruption Warning: the instance is taken in two minutes."
      pattern = {
        source        = ["aws.ec2"]
        "detail-type" = ["EC2 Spot Instance Interruption Warning"]
      }
    }
    rebalance = {
      description = "EC2 Instance Rebalance Recommendation: elevated risk of interruption."
      pattern = {
        source        = ["aws.ec2"]
        "detail-type" = ["EC2 Instance Rebalance Recommendation"]
      }
    }
    state-change = {
      description = "EC2 Instance State-change Notification for the states spotplane acts on."
      pattern = {
        source        = ["aws.ec2"]
        "detail-type" = ["EC2 Instance State-change Notification"]
        detail = {
          state = ["stopping", "stopped", "shutting-down", "terminated"]
        }
      }
    }
    scheduled-change = {
      description = "AWS Health scheduled changes (maintenance, retirement) of EC2 instances."
      pattern = {
        source        = ["aws.health"]
        "detail-type" = ["AWS Health Event"]
        detail = {
          service           = ["EC2"]
          eventTypeCategory = ["scheduledChange"]
        }
      }
    }
  }

  # Built from the names, so the queue policy needs no reference back to the rules.
  interruption_rule_arns = [
    for key in keys(local.interruption_events) :
    "arn:${local.partition}:events:${local.region}:${local.account}:rule/${var.name}-${key}"
  ]
}

resource "aws_sqs_queue" "interruptions" {
  name                       = "${var.name}-interruptions"
  message_retention_seconds  = var.interruption_message_retention_seconds
  receive_wait_time_seconds  = 0
  visibility_timeout_seconds = 30
  # SSE-SQS: encrypted at rest with keys SQS manages, which EventBridge can write to as is.
  sqs_managed_sse_enabled = true
  tags                    = local.tags
}

resource "aws_sqs_queue_policy" "interruptions" {
  queue_url = aws_sqs_queue.interruptions.id
  policy    = data.aws_iam_policy_document.interruptions_queue.json
}

data "aws_iam_policy_document" "interruptions_queue" {
  statement {
    sid       = "EventBridgeRulesSend"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.interruptions.arn]

    principals {
      type        = "Service"
      identifiers = ["events.amazonaws.com"]
    }

    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = local.interruption_rule_arns
    }
  }

  # Only those rules may send: anyone else (an IAM user with sqs:* included) is refused, so a
  # forged "interruption" cannot make spotplane drain nodes.
  statement {
    sid       = "NobodyElseSends"
    effect    = "Deny"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.interruptions.arn]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "ArnNotEquals"
      variable = "aws:SourceArn"
      values   = local.interruption_rule_arns
    }
  }

  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["sqs:*"]
    resources = [aws_sqs_queue.interruptions.arn]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_cloudwatch_event_rule" "interruption" {
  for_each = local.interruption_events

  name          = "${var.name}-${each.key}"
  description   = each.value.description
  event_pattern = jsonencode(each.value.pattern)
  tags          = local.tags
}

resource "aws_cloudwatch_event_target" "interruption" {
  for_each = aws_cloudwatch_event_rule.interruption

  rule      = each.value.name
  target_id = "spotplane-interruption-queue"
  arn       = aws_sqs_queue.interruptions.arn
}
