//! A faithful fake of the AWS Price List Query API's `GetProducts`, for the real aws-sdk-pricing
//! client: AWS JSON 1.1 (`POST /`, `X-Amz-Target: AWSPriceListService.GetProducts`), the
//! documented request (`ServiceCode`, `Filters[{Type, Field, Value}]` with `TERM_MATCH` and
//! `ANY_OF`, `FormatVersion`, `NextToken`, `MaxResults` up to 100) and response
//! (`FormatVersion`, `PriceList` — each product a JSON *string* in the Price List file shape —
//! and `NextToken`). Errors come as `{"__type": "InvalidParameterException", "Message": …}`.
//! There is no emulator for this service (moto has none).

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use wiremock::matchers::{header, method};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// The fake and how many pages it served.
pub struct PriceList {
    pub server: MockServer,
    pub pages_served: Arc<Mutex<u32>>,
}

/// One EC2 product document as the Price List publishes it (trimmed to the fields a reader
/// may look at, with AWS's spelling).
pub fn product(instance_type: &str, region: &str, os: &str, capacity: &str, usd: &str) -> Value {
    let sku = format!(
        "{:X}",
        md5ish(&format!("{instance_type}{region}{os}{capacity}"))
    );
    let term = format!("{sku}.JRTCKXETXF");
    json!({
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {
                "instanceType": instance_type,
                "instanceFamily": "GPU instance",
                "regionCode": region,
                "location": "US East (N. Virginia)",
                "locationType": "AWS Region",
                "operatingSystem": os,
                "tenancy": "Shared",
                "preInstalledSw": "NA",
                "licenseModel": "No License required",
                "capacitystatus": capacity,
                "marketoption": "OnDemand",
                "usagetype": format!("BoxUsage:{instance_type}"),
                "operation": "RunInstances",
                "servicecode": "AmazonEC2"
            },
            "sku": sku
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                (term.clone()): {
                    "priceDimensions": {
                        (format!("{term}.6YS6EN2CT7")): {
                            "unit": "Hrs",
                            "endRange": "Inf",
                            "description": format!("${usd} per On Demand {os} {instance_type} Instance Hour"),
                            "appliesTo": [],
                            "rateCode": format!("{term}.6YS6EN2CT7"),
                            "beginRange": "0",
                            "pricePerUnit": {"USD": usd}
                        }
                    },
                    "sku": sku,
                    "effectiveDate": "2026-11-01T00:00:00Z",
                    "offerTermCode": "JRTCKXETXF",
                    "termAttributes": {}
                }
            },
            "Reserved": {
                (format!("{sku}.4NA7Y494T4")): {
                    "priceDimensions": {
                        (format!("{sku}.4NA7Y494T4.6YS6EN2CT7")): {
                            "unit": "Hrs", "beginRange": "0", "endRange": "Inf",
                            "pricePerUnit": {"USD": "0.0100000000"}
                        }
                    },
                    "termAttributes": {"LeaseContractLength": "1yr", "PurchaseOption": "No Upfront"}
                }
            }
        },
        "version": "20261101000000",
        "publicationDate": "2026-11-01T00:00:00Z"
    })
}

fn md5ish(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

struct GetProducts {
    products: Arc<Mutex<Vec<Value>>>,
    pages: Arc<Mutex<u32>>,
    /// The most products a page holds: AWS may answer with fewer than `MaxResults` and a
    /// `NextToken`, and a reader must follow it.
    page_size: usize,
}

fn error(kind: &str, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(400)
        .insert_header("content-type", "application/x-amz-json-1.1")
        .set_body_string(json!({"__type": kind, "Message": message}).to_string())
}

impl Respond for GetProducts {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let Ok(body) = serde_json::from_slice::<Value>(&req.body) else {
            return error("SerializationException", "body is not JSON");
        };
        if body["ServiceCode"] != "AmazonEC2" {
            return error("NotFoundException", "unknown service code");
        }
        let max = body["MaxResults"].as_u64().unwrap_or(100);
        if !(1..=100).contains(&max) {
            return error("InvalidParameterException", "MaxResults must be 1 to 100");
        }
        let filters: Vec<(String, String, String)> = body["Filters"]
            .as_array()
            .map(|fs| {
                fs.iter()
                    .map(|f| {
                        (
                            f["Type"].as_str().unwrap_or_default().to_owned(),
                            f["Field"].as_str().unwrap_or_default().to_owned(),
                            f["Value"].as_str().unwrap_or_default().to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        for (kind, _, _) in &filters {
            if !["TERM_MATCH", "ANY_OF", "EQUALS", "CONTAINS", "NONE_OF"].contains(&kind.as_str()) {
                return error("InvalidParameterException", "unknown filter type");
            }
        }
        let products = self.products.lock().map(|p| p.clone()).unwrap_or_default();
        let matching: Vec<&Value> = products
            .iter()
            .filter(|p| {
                filters.iter().all(|(kind, field, value)| {
                    let have = p["product"]["attributes"][field]
                        .as_str()
                        .unwrap_or_default();
                    match kind.as_str() {
                        "ANY_OF" => value.split(',').any(|v| v.trim() == have),
                        "NONE_OF" => !value.split(',').any(|v| v.trim() == have),
                        "CONTAINS" => have.contains(value.as_str()),
                        _ => have.eq_ignore_ascii_case(value),
                    }
                })
            })
            .collect();
        let start: usize = match body["NextToken"].as_str() {
            None => 0,
            Some(t) => match t.strip_prefix("page-").and_then(|n| n.parse().ok()) {
                Some(n) => n,
                None => return error("InvalidNextTokenException", "bad token"),
            },
        };
        let end = (start + (max as usize).min(self.page_size)).min(matching.len());
        if let Ok(mut n) = self.pages.lock() {
            *n += 1;
        }
        let mut out = json!({
            "FormatVersion": "aws_v1",
            "PriceList": matching[start.min(end)..end].iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        });
        if end < matching.len() {
            out["NextToken"] = json!(format!("page-{end}"));
        }
        ResponseTemplate::new(200)
            .insert_header("content-type", "application/x-amz-json-1.1")
            .set_body_string(out.to_string())
    }
}

impl PriceList {
    /// Serves `products`, at most `page_size` a page.
    pub async fn start(products: Vec<Value>, page_size: usize) -> PriceList {
        let server = MockServer::start().await;
        let products = Arc::new(Mutex::new(products));
        let pages = Arc::new(Mutex::new(0));
        Mock::given(method("POST"))
            .and(header("x-amz-target", "AWSPriceListService.GetProducts"))
            .respond_with(GetProducts {
                products,
                pages: pages.clone(),
                page_size: page_size.max(1),
            })
            .mount(&server)
            .await;
        PriceList {
            server,
            pages_served: pages,
        }
    }

    pub fn pages(&self) -> u32 {
        self.pages_served.lock().map(|n| *n).unwrap_or(0)
    }
}
