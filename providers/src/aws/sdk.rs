//! The SDK behind the narrow traits: [`SdkEc2`] (aws-sdk-ec2) and [`SdkQueue`] (aws-sdk-sqs),
//! the SDK's errors as [`ProviderError`]s, and EC2's types as the traits' own.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types as ec2t;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use spotplane_core::{GpuModel, Market, Micros};

use super::{
    Ec2Api, Ec2Instance, InstanceTypeInfo, LaunchSpec, PRODUCT, QueueApi, QueueMessage,
    SpotPricePoint,
};
use crate::config::AwsLaunchApi;
use crate::{InstanceState, ProviderError};

/// EC2 through aws-sdk-ec2.
pub struct SdkEc2(pub aws_sdk_ec2::Client);

/// The interruption queue through aws-sdk-sqs.
pub struct SdkQueue {
    pub client: aws_sdk_sqs::Client,
    pub url: String,
}

/// Maps an SDK failure to what the planner branches on.
pub(super) fn sdk_error<E, R>(op: &str, e: SdkError<E, R>) -> ProviderError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match &e {
        SdkError::ServiceError(s) => {
            let err = s.err();
            let code = err.code().unwrap_or("Unknown");
            let message = format!("{op}: {code}: {}", err.message().unwrap_or(""));
            code_error(code, message)
        }
        SdkError::ConstructionFailure(_) => {
            ProviderError::InvalidRequest(format!("{op}: {}", aws_smithy_display(&e)))
        }
        _ => ProviderError::Transient(format!("{op}: {}", aws_smithy_display(&e))),
    }
}

fn aws_smithy_display<E: std::error::Error + 'static>(e: &E) -> String {
    // The SDK's Display is terse ("dispatch failure"); the sources say why.
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// EC2 error codes (docs: "Error codes for the Amazon EC2 API").
pub(super) fn code_error(code: &str, message: String) -> ProviderError {
    match code {
        "InsufficientInstanceCapacity"
        | "InsufficientCapacity"
        | "InsufficientHostCapacity"
        | "InsufficientReservedInstanceCapacity"
        | "Unsupported" => ProviderError::InsufficientCapacity {
            offer_id: String::new(),
            message,
        },
        "MaxSpotInstanceCountExceeded"
        | "InstanceLimitExceeded"
        | "VcpuLimitExceeded"
        | "MaxSpotFleetRequestCountExceeded"
        | "ResourceLimitExceeded" => ProviderError::Quota(message),
        "SpotMaxPriceTooLow" => ProviderError::PriceTooLow(message),
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" | "RequestThrottled" => {
            ProviderError::Throttled {
                retry_after: Duration::from_secs(1),
            }
        }
        "AuthFailure"
        | "UnauthorizedOperation"
        | "InvalidClientTokenId"
        | "ExpiredToken"
        | "SignatureDoesNotMatch"
        | "OptInRequired"
        | "AccessDenied"
        | "AccessDeniedException" => ProviderError::Auth(message),
        c if c.ends_with(".NotFound") || c == "AWS.SimpleQueueService.NonExistentQueue" => {
            ProviderError::NotFound(message)
        }
        "InternalError" | "InternalFailure" | "ServiceUnavailable" | "Unavailable" => {
            ProviderError::Transient(message)
        }
        _ => ProviderError::InvalidRequest(message),
    }
}

fn ec2_tags(tags: &BTreeMap<String, String>) -> Vec<ec2t::Tag> {
    tags.iter()
        .map(|(k, v)| ec2t::Tag::builder().key(k).value(v).build())
        .collect()
}

fn tag_spec(kind: ec2t::ResourceType, tags: &BTreeMap<String, String>) -> ec2t::TagSpecification {
    ec2t::TagSpecification::builder()
        .resource_type(kind)
        .set_tags(Some(ec2_tags(tags)))
        .build()
}

fn smithy_time(t: &aws_sdk_ec2::primitives::DateTime) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.secs(), t.subsec_nanos())
}

fn state_of(name: Option<&ec2t::InstanceStateName>) -> InstanceState {
    use ec2t::InstanceStateName as S;
    match name {
        Some(S::Pending) => InstanceState::Pending,
        Some(S::Running) => InstanceState::Running,
        Some(S::Stopping) => InstanceState::Stopping,
        Some(S::Stopped) => InstanceState::Stopped,
        Some(S::ShuttingDown) => InstanceState::Terminating,
        Some(S::Terminated) => InstanceState::Terminated,
        _ => InstanceState::Pending,
    }
}

fn from_sdk_instance(i: &ec2t::Instance) -> Option<Ec2Instance> {
    Some(Ec2Instance {
        id: i.instance_id()?.to_owned(),
        zone_name: i
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or_default()
            .to_owned(),
        instance_type: i
            .instance_type()
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default(),
        spot: i.instance_lifecycle() == Some(&ec2t::InstanceLifecycleType::Spot),
        state: state_of(i.state().and_then(|s| s.name())),
        launched_at: i.launch_time().and_then(smithy_time),
        tags: i
            .tags()
            .iter()
            .filter_map(|t| Some((t.key()?.to_owned(), t.value()?.to_owned())))
            .collect(),
    })
}

/// Maps an EC2 GPU (`NVIDIA`, `A100`, 40960 MiB) to our model.
pub(super) fn gpu_model_of(name: &str, memory_mib: Option<i32>) -> Option<GpuModel> {
    if let Some(mib) = memory_mib {
        let with_memory = format!("{name}-{}GB", (mib + 512) / 1024);
        if let Ok(m) = with_memory.parse() {
            return Some(m);
        }
    }
    name.parse().ok()
}

#[async_trait]
impl Ec2Api for SdkEc2 {
    async fn availability_zones(&self) -> Result<Vec<(String, String)>, ProviderError> {
        let out = self
            .0
            .describe_availability_zones()
            .send()
            .await
            .map_err(|e| sdk_error("DescribeAvailabilityZones", e))?;
        Ok(out
            .availability_zones()
            .iter()
            .filter_map(|z| Some((z.zone_name()?.to_owned(), z.zone_id()?.to_owned())))
            .collect())
    }

    async fn spot_prices(
        &self,
        types: &[String],
        now: DateTime<Utc>,
    ) -> Result<Vec<SpotPricePoint>, ProviderError> {
        // From now: EC2 answers with the price in effect at the start time, per zone.
        let mut pages = self
            .0
            .describe_spot_price_history()
            .set_instance_types(Some(
                types
                    .iter()
                    .map(|t| ec2t::InstanceType::from(t.as_str()))
                    .collect(),
            ))
            .product_descriptions(PRODUCT)
            .start_time(aws_sdk_ec2::primitives::DateTime::from_secs(
                now.timestamp(),
            ))
            .into_paginator()
            .send();
        let mut points = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error("DescribeSpotPriceHistory", e))?;
            for p in page.spot_price_history() {
                let (Some(zone), Some(ty), Some(price), Some(at)) = (
                    p.availability_zone(),
                    p.instance_type(),
                    p.spot_price(),
                    p.timestamp().and_then(smithy_time),
                ) else {
                    continue;
                };
                match Micros::parse_usd(price) {
                    Ok(price) => points.push(SpotPricePoint {
                        zone_name: zone.to_owned(),
                        instance_type: ty.as_str().to_owned(),
                        price,
                        at,
                    }),
                    Err(e) => tracing::warn!(price, error = %e, "unreadable spot price skipped"),
                }
            }
        }
        Ok(points)
    }

    async fn instance_types(
        &self,
        types: &[String],
    ) -> Result<Vec<InstanceTypeInfo>, ProviderError> {
        let mut pages = self
            .0
            .describe_instance_types()
            .set_instance_types(Some(
                types
                    .iter()
                    .map(|t| ec2t::InstanceType::from(t.as_str()))
                    .collect(),
            ))
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error("DescribeInstanceTypes", e))?;
            for t in page.instance_types() {
                let Some(ty) = t.instance_type() else {
                    continue;
                };
                let gpus = t.gpu_info().map(|g| g.gpus()).unwrap_or_default();
                let gpu_count: i32 = gpus.iter().filter_map(|g| g.count()).sum();
                let gpu_model = gpus.first().and_then(|g| {
                    gpu_model_of(g.name()?, g.memory_info().and_then(|m| m.size_in_mib()))
                });
                out.push(InstanceTypeInfo {
                    instance_type: ty.as_str().to_owned(),
                    vcpus: t
                        .v_cpu_info()
                        .and_then(|v| v.default_v_cpus())
                        .and_then(|v| u32::try_from(v).ok())
                        .unwrap_or(0),
                    memory_mib: t
                        .memory_info()
                        .and_then(|m| m.size_in_mib())
                        .and_then(|m| u64::try_from(m).ok())
                        .unwrap_or(0),
                    gpu_model,
                    gpu_count: u32::try_from(gpu_count).unwrap_or(0),
                });
            }
        }
        Ok(out)
    }

    async fn launch(&self, spec: &LaunchSpec) -> Result<String, ProviderError> {
        let user_data = spec
            .user_data
            .as_ref()
            .map(|u| base64::engine::general_purpose::STANDARD.encode(u));
        // IMDSv2 only: the node agent asks for a token first.
        let imds = ec2t::LaunchTemplateInstanceMetadataOptionsRequest::builder()
            .http_tokens(ec2t::LaunchTemplateHttpTokensState::Required)
            .http_endpoint(ec2t::LaunchTemplateInstanceMetadataEndpointState::Enabled)
            .build();
        match spec.api {
            AwsLaunchApi::RunInstances => {
                let mut call = self
                    .0
                    .run_instances()
                    .image_id(&spec.image_id)
                    .instance_type(ec2t::InstanceType::from(spec.instance_type.as_str()))
                    .min_count(1)
                    .max_count(1)
                    .client_token(&spec.client_token)
                    .placement(
                        ec2t::Placement::builder()
                            .availability_zone(&spec.zone_name)
                            .build(),
                    )
                    .metadata_options(
                        ec2t::InstanceMetadataOptionsRequest::builder()
                            .http_tokens(ec2t::HttpTokensState::Required)
                            .http_endpoint(ec2t::InstanceMetadataEndpointState::Enabled)
                            .build(),
                    )
                    .tag_specifications(tag_spec(ec2t::ResourceType::Instance, &spec.tags))
                    .set_subnet_id(spec.subnet_id.clone())
                    .set_user_data(user_data)
                    .set_security_group_ids(if spec.security_group_ids.is_empty() {
                        None
                    } else {
                        Some(spec.security_group_ids.clone())
                    });
                if let Some(profile) = &spec.instance_profile {
                    call = call.iam_instance_profile(
                        ec2t::IamInstanceProfileSpecification::builder()
                            .name(profile)
                            .build(),
                    );
                }
                if spec.market == Market::Spot {
                    call = call.instance_market_options(
                        ec2t::InstanceMarketOptionsRequest::builder()
                            .market_type(ec2t::MarketType::Spot)
                            .spot_options(
                                ec2t::SpotMarketOptions::builder()
                                    .spot_instance_type(ec2t::SpotInstanceType::OneTime)
                                    .instance_interruption_behavior(
                                        ec2t::InstanceInterruptionBehavior::Terminate,
                                    )
                                    .build(),
                            )
                            .build(),
                    );
                }
                let out = call
                    .send()
                    .await
                    .map_err(|e| sdk_error("RunInstances", e))?;
                out.instances()
                    .first()
                    .and_then(|i| i.instance_id())
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        ProviderError::Transient("RunInstances returned no instance".into())
                    })
            }
            AwsLaunchApi::CreateFleet => {
                let template = spec.template_name();
                let mut data = ec2t::RequestLaunchTemplateData::builder()
                    .image_id(&spec.image_id)
                    .metadata_options(imds)
                    .set_user_data(user_data)
                    .set_security_group_ids(if spec.security_group_ids.is_empty() {
                        None
                    } else {
                        Some(spec.security_group_ids.clone())
                    });
                if let Some(profile) = &spec.instance_profile {
                    data = data.iam_instance_profile(
                        ec2t::LaunchTemplateIamInstanceProfileSpecificationRequest::builder()
                            .name(profile)
                            .build(),
                    );
                }
                let created = self
                    .0
                    .create_launch_template()
                    .launch_template_name(&template)
                    .launch_template_data(data.build())
                    .send()
                    .await;
                match created {
                    Ok(_) => {}
                    Err(SdkError::ServiceError(s))
                        if s.err().code()
                            == Some("InvalidLaunchTemplateName.AlreadyExistsException") => {}
                    Err(e) => return Err(sdk_error("CreateLaunchTemplate", e)),
                }
                let spot = spec.market == Market::Spot;
                let capacity = ec2t::TargetCapacitySpecificationRequest::builder()
                    .total_target_capacity(1)
                    .default_target_capacity_type(if spot {
                        ec2t::DefaultTargetCapacityType::Spot
                    } else {
                        ec2t::DefaultTargetCapacityType::OnDemand
                    })
                    .build();
                let mut overrides = ec2t::FleetLaunchTemplateOverridesRequest::builder()
                    .instance_type(ec2t::InstanceType::from(spec.instance_type.as_str()))
                    .availability_zone(&spec.zone_name);
                if let Some(subnet) = &spec.subnet_id {
                    overrides = overrides.subnet_id(subnet);
                }
                let mut call = self
                    .0
                    .create_fleet()
                    .r#type(ec2t::FleetType::Instant)
                    .client_token(&spec.client_token)
                    .target_capacity_specification(capacity)
                    .launch_template_configs(
                        ec2t::FleetLaunchTemplateConfigRequest::builder()
                            .launch_template_specification(
                                ec2t::FleetLaunchTemplateSpecificationRequest::builder()
                                    .launch_template_name(&template)
                                    .version("$Latest")
                                    .build(),
                            )
                            .overrides(overrides.build())
                            .build(),
                    )
                    .tag_specifications(tag_spec(ec2t::ResourceType::Instance, &spec.tags));
                call = if spot {
                    call.spot_options(
                        ec2t::SpotOptionsRequest::builder()
                            .allocation_strategy(
                                ec2t::SpotAllocationStrategy::PriceCapacityOptimized,
                            )
                            .build(),
                    )
                } else {
                    call.on_demand_options(
                        ec2t::OnDemandOptionsRequest::builder()
                            .allocation_strategy(ec2t::FleetOnDemandAllocationStrategy::LowestPrice)
                            .build(),
                    )
                };
                let out = call.send().await.map_err(|e| sdk_error("CreateFleet", e))?;
                if let Some(id) = out.instances().iter().flat_map(|i| i.instance_ids()).next() {
                    return Ok(id.clone());
                }
                // An instant fleet reports launch failures in the response, not as an error.
                Err(match out.errors().first() {
                    Some(e) => code_error(
                        e.error_code().unwrap_or("Unknown"),
                        format!(
                            "CreateFleet: {}: {}",
                            e.error_code().unwrap_or("Unknown"),
                            e.error_message().unwrap_or("")
                        ),
                    ),
                    None => ProviderError::Transient("CreateFleet launched nothing".into()),
                })
            }
        }
    }

    async fn terminate(&self, ids: &[String]) -> Result<(), ProviderError> {
        self.0
            .terminate_instances()
            .set_instance_ids(Some(ids.to_vec()))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| sdk_error("TerminateInstances", e))
    }

    async fn instances_by_tags(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> Result<Vec<Ec2Instance>, ProviderError> {
        let filters = tags
            .iter()
            .map(|(k, v)| {
                ec2t::Filter::builder()
                    .name(format!("tag:{k}"))
                    .values(v)
                    .build()
            })
            .collect();
        self.describe(self.0.describe_instances().set_filters(Some(filters)))
            .await
    }

    async fn instances_by_id(&self, ids: &[String]) -> Result<Vec<Ec2Instance>, ProviderError> {
        self.describe(
            self.0
                .describe_instances()
                .set_instance_ids(Some(ids.to_vec())),
        )
        .await
    }
}

impl SdkEc2 {
    async fn describe(
        &self,
        call: aws_sdk_ec2::operation::describe_instances::builders::DescribeInstancesFluentBuilder,
    ) -> Result<Vec<Ec2Instance>, ProviderError> {
        let mut pages = call.into_paginator().send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error("DescribeInstances", e))?;
            for r in page.reservations() {
                out.extend(r.instances().iter().filter_map(from_sdk_instance));
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl QueueApi for SdkQueue {
    async fn receive(&self) -> Result<Vec<QueueMessage>, ProviderError> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(10)
            .wait_time_seconds(0)
            .send()
            .await
            .map_err(|e| sdk_error("ReceiveMessage", e))?;
        Ok(out
            .messages()
            .iter()
            .filter_map(|m| {
                Some(QueueMessage {
                    body: m.body()?.to_owned(),
                    receipt_handle: m.receipt_handle()?.to_owned(),
                })
            })
            .collect())
    }

    async fn delete(&self, receipt_handle: &str) -> Result<(), ProviderError> {
        self.client
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(receipt_handle)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| sdk_error("DeleteMessage", e))
    }
}
