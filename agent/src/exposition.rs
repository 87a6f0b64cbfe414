//! The Prometheus text exposition format (version 0.0.4), read sample by sample.
//!
//! Written here because no permissively licensed crate reads all that the serving engines
//! write: `prometheus-parse` (which reads dcgm-exporter, see `dcgm.rs`) drops every name with a
//! `:` in it, which is all of vLLM's (`vllm:prompt_tokens_total`), and the parsers that accept
//! them are LGPL or fail on the blank line TGI's exporter writes after each family. What is read
//! is what the format defines for a sample line: a name (`[a-zA-Z_:][a-zA-Z0-9_:]*`), labels
//! `{name="value",…}` with `\\`, `\"` and `\n` escapes, a value (`NaN` and `±Inf` included) and an
//! optional timestamp. `#` lines (HELP, TYPE, an OpenMetrics `# EOF`) and blank lines are
//! skipped.

use std::collections::BTreeMap;

/// The text an exporter's metrics endpoint answers, or why there is none. Asks for the plain
/// text format: prometheus_client (vLLM) answers an OpenMetrics Accept header in OpenMetrics,
/// whose counters drop the `_total` that names carry here.
pub async fn fetch(client: &reqwest::Client, url: &str) -> Result<String, String> {
    let response = client
        .get(url)
        .header(reqwest::header::ACCEPT, "text/plain")
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("answered {status}"));
    }
    response.text().await.map_err(|e| e.to_string())
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A line that is not a sample, with where it goes wrong (both counted from 1).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Every sample of `text`, in order; the first line that is not one fails the whole text (a
/// reading half understood could count half the work).
pub fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        let sample = Line {
            text: trimmed,
            at: 0,
        }
        .sample()
        .map_err(|(at, message)| ParseError {
            line: i + 1,
            column: indent + trimmed[..at].chars().count() + 1,
            message,
        })?;
        samples.push(sample);
    }
    Ok(samples)
}

/// A position in one line, in bytes.
struct Line<'a> {
    text: &'a str,
    at: usize,
}

type Failure = (usize, String);

impl<'a> Line<'a> {
    fn rest(&self) -> &'a str {
        &self.text[self.at..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn fail<T>(&self, message: impl Into<String>) -> Result<T, Failure> {
        Err((self.at, message.into()))
    }

    fn skip_blanks(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start_matches([' ', '\t']).len();
    }

    fn name(&mut self, what: &str, colon: bool) -> Result<String, Failure> {
        let rest = self.rest();
        let len = rest
            .char_indices()
            .find(|&(i, c)| {
                let ok = c.is_ascii_alphabetic() || c == '_' || (colon && c == ':');
                !(ok || (i > 0 && c.is_ascii_digit()))
            })
            .map_or(rest.len(), |(i, _)| i);
        if len == 0 {
            return self.fail(format!("expected a {what}"));
        }
        let name = rest[..len].to_owned();
        self.at += len;
        Ok(name)
    }

    fn expect(&mut self, c: char) -> Result<(), Failure> {
        if self.peek() == Some(c) {
            self.at += c.len_utf8();
            Ok(())
        } else {
            self.fail(format!("expected '{c}'"))
        }
    }

    fn quoted(&mut self) -> Result<String, Failure> {
        let open = self.at;
        self.expect('"')?;
        let mut value = String::new();
        let mut chars = self.rest().char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.at += i + 1;
                    return Ok(value);
                }
                '\\' => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    _ => {
                        self.at += i;
                        return self.fail("a label value may escape only \\\\, \\\" and \\n");
                    }
                },
                c => value.push(c),
            }
        }
        self.at = open;
        self.fail("a label value is not closed")
    }

    fn labels(&mut self) -> Result<BTreeMap<String, String>, Failure> {
        let mut labels = BTreeMap::new();
        if self.peek() != Some('{') {
            return Ok(labels);
        }
        self.at += 1;
        loop {
            self.skip_blanks();
            if self.peek() == Some('}') {
                self.at += 1;
                return Ok(labels);
            }
            let start = self.at;
            let name = self.name("label name", false)?;
            self.skip_blanks();
            self.expect('=')?;
            self.skip_blanks();
            let value = self.quoted()?;
            if labels.insert(name, value).is_some() {
                self.at = start;
                return self.fail("a label appears twice");
            }
            self.skip_blanks();
            match self.peek() {
                Some(',') => self.at += 1,
                Some('}') => {}
                _ => return self.fail("expected ',' or '}'"),
            }
        }
    }

    fn sample(mut self) -> Result<Sample, Failure> {
        let name = self.name("metric name", true)?;
        let labels = self.labels()?;
        if !matches!(self.peek(), Some(' ' | '\t')) {
            return self.fail("expected a space before the value");
        }
        self.skip_blanks();
        let mut fields = self.rest().split_whitespace();
        let Some(text) = fields.next() else {
            return self.fail("expected a value");
        };
        let value: f64 = text
            .parse()
            .or_else(|_| self.fail(format!("{text:?} is not a number")))?;
        if let Some(timestamp) = fields.next() {
            if timestamp.parse::<i64>().is_err() {
                self.at += self.rest().find(timestamp).unwrap_or(0);
                return self.fail(format!("{timestamp:?} is not a timestamp"));
            }
        }
        if let Some(extra) = fields.next() {
            self.at += self.rest().rfind(extra).unwrap_or(0);
            return self.fail("unexpected text after the timestamp");
        }
        Ok(Sample {
            name,
            labels,
            value,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_colons_escapes_special_values_and_timestamps() {
        let text = "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n\
            # TYPE vllm:prompt_tokens_total counter\n\
            vllm:prompt_tokens_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1234.0\n\
            \n\
            tgi_request_success 12\n\
            odd{path=\"a\\\\b\",quote=\"say \\\"hi\\\"\",nl=\"x\\ny\",} +Inf 1700000000000\n\
            nan_here NaN\n\
            # EOF\n";
        let s = parse(text).unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].name, "vllm:prompt_tokens_total");
        assert_eq!(
            s[0].labels.get("model_name").map(String::as_str),
            Some("meta-llama/Llama-3.1-8B-Instruct")
        );
        assert_eq!(s[0].value, 1234.0);
        assert_eq!(
            (s[1].name.as_str(), s[1].value),
            ("tgi_request_success", 12.0)
        );
        assert!(s[1].labels.is_empty());
        assert_eq!(s[2].labels["path"], "a\\b");
        assert_eq!(s[2].labels["quote"], "say \"hi\"");
        assert_eq!(s[2].labels["nl"], "x\ny");
        assert_eq!(s[2].value, f64::INFINITY);
        assert!(s[3].value.is_nan());
    }

    #[test]
    fn garbage_is_named_by_line_and_column() {
        let at = |text: &str| {
            let e = parse(text).unwrap_err();
            (e.line, e.column)
        };
        assert_eq!(at("ok 1\n<html>\n"), (2, 1));
        assert_eq!(at("ok 1\nbad{a=\"1\" 2\n"), (2, 11));
        assert_eq!(at("x{a=\"1\"} twelve\n"), (1, 10));
        assert_eq!(at("x{a=1} 2\n"), (1, 5));
        assert_eq!(at("x{a=\"1\",a=\"2\"} 2\n"), (1, 9));
        assert_eq!(at("x{a=\"\\t\"} 2\n"), (1, 6));
        assert_eq!(at("x 1 2 3\n"), (1, 7));
        assert_eq!(at("x{a=\"open} 1\n"), (1, 5));
        let e = parse("up 1\nnot a metric line\n").unwrap_err();
        assert_eq!(e.to_string(), "line 2, column 5: \"a\" is not a number");
    }
}
