/** The reader of an id path segment, shared by the route tables that take one. */
import { decodeComponent } from '../http/query.js';
import type { ParamReader } from './route-record.js';
import { isIdLength } from './validation.js';
import { ID_LENGTH_MAX } from '../../shared/limits.js';

/** Reads an id path segment `name`: 400 when its percent-encoding or length is wrong. */
export function idParam(name: string): ParamReader {
  return (raw, ex) => {
    const value = decodeComponent(raw, false);
    if (value === null) {
      ex.fail('invalid_query', { detail: `${name} has invalid percent-encoding` });
      return null;
    }
    if (!isIdLength(value)) {
      ex.fail('invalid_query', { detail: `${name} must be 1 to ${ID_LENGTH_MAX} characters` });
      return null;
    }
    return value;
  };
}
