/**
 * The two environments every customer, key and configuration belongs to. In the leaf
 * because the core, the shard shell, storage and the front end all address data by it.
 */
export type Environment = 'test' | 'live';
